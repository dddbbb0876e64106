package mdmplist_test

import (
	"bytes"
	"maps"
	"os"
	"path/filepath"
	"testing"

	"github.com/stepcollect/stepcollect/internal/mdmplist"
	"github.com/stepcollect/stepcollect/internal/mdmplist/plisttest"
)

// The fast reader accepts only what encoding/xml accepts, with the same
// strings; whatever it does not take is read by encoding/xml, whose answer
// stands. The seeds are the valid plists, the hostile corpus, and the
// corners the fast reader sends back.
func FuzzFastTokensAgreeWithEncodingXML(f *testing.F) {
	for _, tc := range valid() {
		f.Add(tc.data)
	}
	for _, c := range plisttest.Hostile() {
		f.Add(c.Data)
	}
	for _, s := range fastCorners {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fastAgrees(t, data)
	})
}

// fastAgrees fails t if the fast reader accepts data differently from
// encoding/xml.
func fastAgrees(t *testing.T, data []byte) {
	t.Helper()
	keys := []string{"Status", "CommandUUID", "UDID"}
	fast, err := mdmplist.FastXML(data, mdmplist.DefaultLimits, keys...)
	if err != nil {
		return
	}
	slow, err := mdmplist.SlowXML(data, mdmplist.DefaultLimits, keys...)
	if err != nil {
		t.Fatalf("the fast reader accepts %q (%q), encoding/xml refuses it: %v", data, fast, err)
	}
	if !maps.Equal(fast, slow) {
		t.Fatalf("%q: the fast reader read %q, encoding/xml %q", data, fast, slow)
	}
}

// fastCorners are inputs near the edges of the fast reader's subset.
var fastCorners = []string{
	`<?xml version="1.0" encoding="UTF-8"?><!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd"><plist version="1.0"><dict><key>Status</key><string>Acknowledged</string></dict></plist>`,
	"<plist><dict><key>Status</key><string>a\r\nb</string></dict></plist>",
	"<plist><dict><key>Status</key><string>]]></string></dict></plist>",
	"<plist><dict><key>Status</key><string>&lt;&gt;&amp;&quot;&apos;</string></dict></plist>",
	"<plist><dict><key>Status</key><string>&#65;</string></dict></plist>",
	"<plist><dict><key>Status</key><string><![CDATA[x]]></string></dict></plist>",
	"<plist><!-- a -- b --><dict/></plist>",
	"<plist><!----><dict/></plist>",
	"<plist><!-- x ---><dict/></plist>",
	`<!DOCTYPE plist "a>b"><plist><dict/></plist>`,
	"<plist version='1.0'><dict/></plist>",
	"<plist version = \"1.0\"><dict/></plist>",
	"<plist a=\"1\" a=\"2\"><dict/></plist>",
	"<plist><dict ><key >Status</key ><string\t>x</string\n></dict></plist>",
	"<plist><dict><key>Status</key><string>\x7f\x01</string></dict></plist>",
	"<plist><dict><key>Status</key><string>\xef\xbf\xbd \xed\xa0\x80 \xf4\x90\x80\x80</string></dict></plist>",
	"\xef\xbb\xbf<plist><dict/></plist>",
	"<plist><dict><key>Status</key><true/><key>CommandUUID</key><string>U</string></dict></plist>",
	"<plist><dict><key>Status</key><string>x</string><key>Status</key><string>y</string></dict></plist>",
	"<?xml version=\"1.1\"?><plist><dict/></plist>",
	"<plist><dict><data>AA==</data></dict></plist>",
	"<plist><dict/></plist><",
	"<plist><dict/></plist></plist>",
	"<ns:plist><dict/></ns:plist>",
}

// What plist writers write takes the fast path: Apple's layout with its
// declaration and DOCTYPE, micromdm/plist's, and a large inventory.
func TestWhatPlistWritersWriteTakesTheFastPath(t *testing.T) {
	t.Parallel()
	cases := map[string][]byte{
		"apple corner":       []byte(fastCorners[0]),
		"generated result":   plisttest.ResultXML("Acknowledged", "U-1", "D-1"),
		"installed apps":     plisttest.Encode(plisttest.InstalledApplicationList(300, "U-2", "D-1")),
		"deep, within limit": plisttest.DeepXML(20),
	}
	for _, tc := range valid() {
		if !bytes.HasPrefix(tc.data, []byte("bplist")) && !bytes.Contains(tc.data, []byte("&#")) && !bytes.Contains(tc.data, []byte("<![CDATA[")) { // outside the subset on purpose
			cases[tc.name] = tc.data
		}
	}
	for name, data := range cases {
		if bytes.HasPrefix(data, []byte("bplist")) {
			continue
		}
		if _, err := mdmplist.FastXML(data, mdmplist.DefaultLimits, "Status", "CommandUUID"); err != nil {
			t.Errorf("%s: the fast reader sends it to encoding/xml: %v", name, err)
		}
		fastAgrees(t, data)
	}
}

// Every corner and every file of the fuzz corpus: the fast reader never
// accepts differently (the fuzz target's seeds, run as a plain test too).
func TestFastReaderAgreesOnTheCorpus(t *testing.T) {
	t.Parallel()
	for _, s := range fastCorners {
		fastAgrees(t, []byte(s))
	}
	files, _ := filepath.Glob("testdata/fuzz/*/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fastAgrees(t, b)
	}
}

// BenchmarkXMLResult reads a DeviceInformation-sized result (Apple's
// layout) with the fast reader and with encoding/xml.
func BenchmarkXMLResult(b *testing.B) {
	data := []byte(queryResultXML)
	data = bytes.ReplaceAll(data, []byte("<string><![CDATA[https://example.com/catalog?a=1&b=2]]></string>"), []byte("<string>https://example.com/catalog?a=1&amp;b=2</string>"))
	if _, err := mdmplist.FastXML(data, mdmplist.DefaultLimits, "Status"); err != nil {
		b.Fatal(err)
	}
	for name, read := range map[string]func([]byte, mdmplist.Limits, ...string) (map[string]string, error){"fast": mdmplist.FastXML, "encoding-xml": mdmplist.SlowXML} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := read(data, mdmplist.DefaultLimits, "Status", "CommandUUID"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
