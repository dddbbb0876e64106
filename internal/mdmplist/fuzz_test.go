package mdmplist_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/micromdm/plist"

	"github.com/stepcollect/stepcollect/internal/mdmplist"
	"github.com/stepcollect/stepcollect/internal/mdmplist/plisttest"
)

// FuzzTopLevelStrings: whatever the bytes, TopLevelStrings does not panic,
// an error is one line, and what it accepts as XML (at a depth and size
// where micromdm/plist's recursive decoder is safe) micromdm/plist decodes
// too, to the same Status and CommandUUID. Binary inputs are not given to
// micromdm/plist: the corpus holds ones that kill it.
//
// The seeds are the valid plists here; the hostile ones are the corpus in
// testdata/fuzz/FuzzTopLevelStrings (kept in step with plisttest.Hostile by
// TestCorpusKeepsEveryHostilePlist).
func FuzzTopLevelStrings(f *testing.F) {
	for _, tc := range valid() {
		f.Add(tc.data)
	}
	f.Add(plisttest.Encode(plisttest.InstalledApplicationList(3, "U", "D")))
	f.Add(plisttest.DeepXML(20))
	f.Add([]byte(`<plist><dict><key>Status</key><string>A</string><key>CommandUUID</key><string>U</string></dict></plist>`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := mdmplist.TopLevelStrings(data, mdmplist.DefaultLimits, "Status", "CommandUUID")
		if err != nil {
			if msg := err.Error(); msg == "" || strings.ContainsAny(msg, "\r\n") {
				t.Fatalf("error %q is not one line", msg)
			}
			return
		}
		if got == nil {
			t.Fatal("accepted, but no map")
		}
		if bytes.HasPrefix(data, []byte("bplist")) {
			return
		}
		// micromdm/plist only where it is safe: little nesting, few elements.
		if _, err := mdmplist.TopLevelStrings(data, mdmplist.Limits{MaxDepth: 32, MaxElements: 10000}); err != nil {
			return
		}
		var want struct{ Status, CommandUUID string }
		if err := plist.Unmarshal(data, &want); err != nil {
			t.Fatalf("accepted (%q), but micromdm/plist refuses it: %v", got, err)
		}
		if got["Status"] != want.Status || got["CommandUUID"] != want.CommandUUID {
			t.Fatalf("read %q, micromdm/plist %+v", got, want)
		}
	})
}
