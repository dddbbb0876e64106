package httpapi_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/mdmplist/plisttest"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
)

// FuzzDecodeWebhook: whatever the body, the decoder does not panic; an
// error is a one-line "invalid" naming a field; a decoded event is
// consistent with its action. The seeds include results whose raw_payload
// is each hostile plist of plisttest.Hostile (ones that once killed the
// process), an XML plist nested 100 000 deep, and valid binary results.
// `make test` runs the seed corpus, then `make fuzz` explores a little;
// `go test -fuzz FuzzDecodeWebhook ./httpapi` explores.
func FuzzDecodeWebhook(f *testing.F) {
	for _, s := range []string{
		string(testkit.Acknowledged("DEV-1", "U-1")),
		`{"topic":"mdm.Connect","acknowledge_event":{"enrollment_id":"E","raw_payload":"` + base64.StdEncoding.EncodeToString(testkit.ResultPlist("", "U", "NotNow")) + `"}}`,
		`{"topic":"mdm.Connect","acknowledge_event":{"udid":"D","raw_payload":"` + base64.StdEncoding.EncodeToString(testkit.ResultPlist("D", "", "Idle")) + `"}}`,
		`{"topic":"mdm.CheckOut","checkin_event":{"udid":"D","raw_payload":"` + base64.StdEncoding.EncodeToString(checkinPlist("D", "CheckOut")) + `"}}`,
		`{"topic":"mdm.TokenUpdate","checkin_event":{}}`,
		`{"topic":"mdm.Connect","acknowledge_event":{"udid":"D","raw_payload":"PHBsaXN0"}}`,
		`{"topic":7}`, `[]`, `null`, ``, `{`, "\x00\xff",
		ackBody(plisttest.ResultBinary("Acknowledged", "U-1", "DEV-1")),
		ackBody(plisttest.ResultBinary("Error", "", "DEV-1")),
		ackBody(plisttest.Build(1, plisttest.Array(1, 0))), // an array that contains itself
		ackBody(plisttest.DeepXML(100000)),
	} {
		f.Add([]byte(s))
	}
	for _, tc := range plisttest.Hostile() {
		f.Add([]byte(ackBody(tc.Data)))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ev, err := httpapi.DecodeWebhook(body)
		if err != nil {
			if storage.ErrorCode(err) != storage.EInvalid {
				t.Fatalf("error %q is not an invalid-input error", err)
			}
			if msg := err.Error(); strings.ContainsAny(msg, "\n\r") || !strings.Contains(msg, ": ") {
				t.Fatalf("error %q is not one line naming a field", msg)
			}
			return
		}
		switch ev.Action {
		case httpapi.CommitResult:
			if ev.EnrollmentID == "" || ev.CommandUUID == "" || ev.Status == "" || ev.Status == "Idle" || len(ev.Raw) == 0 {
				t.Fatalf("result without what committing needs: %+v", ev)
			}
		case httpapi.CancelEnrollment:
			if ev.EnrollmentID == "" {
				t.Fatalf("cancel without an enrollment: %+v", ev)
			}
		case httpapi.Ignore:
			if ev.Reason == "" {
				t.Fatalf("ignored without a reason: %+v", ev)
			}
		}
	})
}
