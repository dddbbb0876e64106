package mdmplist_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/micromdm/plist"

	"github.com/stepcollect/stepcollect/internal/mdmplist"
	"github.com/stepcollect/stepcollect/internal/mdmplist/plisttest"
)

var update = flag.Bool("update", false, "rewrite testdata/fuzz/FuzzTopLevelStrings from plisttest.Hostile")

// A result as NanoMDM relays it from a device (an InstallProfile that
// failed), byte for byte as macOS writes it.
const errorResultXML = `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>CommandUUID</key>
	<string>7c4a0b6e-3f1d-4c2a-9a57-0b2f6f3c1e11</string>
	<key>ErrorChain</key>
	<array>
		<dict>
			<key>ErrorCode</key>
			<integer>4001</integer>
			<key>ErrorDomain</key>
			<string>MCProfileErrorDomain</string>
			<key>LocalizedDescription</key>
			<string>The profile “Wi-Fi (Corp)” could not be installed.</string>
			<key>USEnglishDescription</key>
			<string>The profile “Wi-Fi (Corp)” could not be installed.</string>
		</dict>
		<dict>
			<key>ErrorCode</key>
			<integer>-1</integer>
			<key>ErrorDomain</key>
			<string>MCInstallationErrorDomain</string>
			<key>LocalizedDescription</key>
			<string>The payload &lt;Wi-Fi&gt; could not be installed &amp; was rolled back.</string>
		</dict>
	</array>
	<key>Status</key>
	<string>Error</string>
	<key>UDID</key>
	<string>0000FE00-5A1B2C3D4E5F6071</string>
</dict>
</plist>
`

// A DeviceInformation result, with every kind of value.
const queryResultXML = `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>CommandUUID</key>
	<string>0b1d2f4a-info</string>
	<key>QueryResponses</key>
	<dict>
		<key>AvailableDeviceCapacity</key>
		<real>412.53</real>
		<key>BatteryLevel</key>
		<real></real>
		<key>DeviceName</key>
		<string>Anna’s MacBook Pro</string>
		<key>IsSupervised</key>
		<true/>
		<key>IsActivationLockEnabled</key>
		<false/>
		<key>LastCloudBackupDate</key>
		<date>2026-11-28T22:00:00Z</date>
		<key>PushToken</key>
		<data>
		3q2+7w==
		</data>
		<key>Empty</key>
		<data></data>
		<key>OSUpdateSettings</key>
		<dict>
			<key>CatalogURL</key>
			<string><![CDATA[https://example.com/catalog?a=1&b=2]]></string>
			<key>PreviousScanResult</key>
			<integer> 0 </integer>
		</dict>
		<key>Status</key>
		<string>not the top-level one</string>
	</dict>
	<!-- a comment -->
	<key>Status</key>
	<string>Acknowledged</string>
	<key>UDID</key>
	<string>0000FE00-5A1B2C3D4E5F6071</string>
</dict>
</plist>
`

const checkinXML = `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
<dict>
	<key>MessageType</key>
	<string>CheckOut</string>
	<key>Topic</key>
	<string>com.apple.mgmt.External.1234</string>
	<key>UDID</key>
	<string>0000FE00-5A1B2C3D4E5F6071</string>
</dict>
</plist>
`

// valid are plists TopLevelStrings accepts, with what it reads of them.
func valid() []struct {
	name string
	data []byte
	keys []string
	want map[string]string
} {
	su := []string{"Status", "CommandUUID"}
	type tc = struct {
		name string
		data []byte
		keys []string
		want map[string]string
	}
	return []tc{
		{"xml error result", []byte(errorResultXML), su, map[string]string{"Status": "Error", "CommandUUID": "7c4a0b6e-3f1d-4c2a-9a57-0b2f6f3c1e11"}},
		{"xml query result", []byte(queryResultXML), su, map[string]string{"Status": "Acknowledged", "CommandUUID": "0b1d2f4a-info"}},
		{"xml check-out", []byte(checkinXML), []string{"MessageType"}, map[string]string{"MessageType": "CheckOut"}},
		{"xml generated error result", plisttest.ResultXML("Error", "U-1", "D-1"), su, map[string]string{"Status": "Error", "CommandUUID": "U-1"}},
		{"xml bare root dict", []byte(`<dict><key>Status</key><string>NotNow</string></dict>`), su, map[string]string{"Status": "NotNow"}},
		{"xml empty dict", []byte("<plist version=\"1.0\">\n<dict/>\n</plist>\n"), su, map[string]string{}},
		{"xml no keys wanted", []byte(errorResultXML), nil, map[string]string{}},
		{"xml empty status", []byte(`<plist><dict><key>Status</key><string/></dict></plist>`), su, map[string]string{"Status": ""}},
		{"xml entities in status", []byte(`<plist><dict><key>St&#97;tus</key><string>A&amp;B&#x263A;</string></dict></plist>`), su, map[string]string{"Status": "A&B☺"}},
		{"binary error result", plisttest.ResultBinary("Error", "U-1", "D-1"), su, map[string]string{"Status": "Error", "CommandUUID": "U-1"}},
		{"binary acknowledged", plisttest.ResultBinary("Acknowledged", "U-2", "D-1"), su, map[string]string{"Status": "Acknowledged", "CommandUUID": "U-2"}},
		{"binary utf-16 keys and values", plisttest.Build(1, plisttest.Dict(1, 1, 2, 3, 4), plisttest.UTF16("Status"), plisttest.UTF16("Acknowledged ✓"), plisttest.UTF16("CommandUUID"), plisttest.ASCII("U-3")),
			su, map[string]string{"Status": "Acknowledged ✓", "CommandUUID": "U-3"}},
		{"binary shared references", plisttest.Build(1, plisttest.Dict(1, 1, 2, 3, 4), plisttest.ASCII("Status"), plisttest.ASCII("Acknowledged"), plisttest.ASCII("Both"), plisttest.Array(1, 2, 2, 2)),
			su, map[string]string{"Status": "Acknowledged"}},
		{"binary long strings", plisttest.Encode(map[string]any{"Status": strings.Repeat("s", 300), "CommandUUID": strings.Repeat("ü", 70000)}),
			su, map[string]string{"Status": strings.Repeat("s", 300), "CommandUUID": strings.Repeat("ü", 70000)}},
		{"binary check-out", plisttest.Encode(map[string]any{"MessageType": "CheckOut", "UDID": "D-1"}), []string{"MessageType"}, map[string]string{"MessageType": "CheckOut"}},
		{"binary empty dict", plisttest.Build(1, plisttest.Dict(1)), su, map[string]string{}},
		// written by another writer, Python's plistlib (which shares equal strings)
		{"binary from plistlib", readFile("testdata/plistlib-result.bplist"), su, map[string]string{"Status": "Error", "CommandUUID": "5f0c1e2a-plistlib"}},
	}
}

func readFile(name string) []byte {
	b, err := os.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return b
}

func TestTopLevelStringsReadsValidPlists(t *testing.T) {
	t.Parallel()
	for _, tc := range valid() {
		t.Run(tc.name, func(t *testing.T) {
			got, err := mdmplist.TopLevelStrings(tc.data, mdmplist.DefaultLimits, tc.keys...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// What micromdm/plist reads of the valid plists (all safe for it) is what
// TopLevelStrings reads, binary ones included.
func TestTopLevelStringsAgreesWithMicromdmPlist(t *testing.T) {
	t.Parallel()
	for _, tc := range valid() {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]any{}
			if err := plist.Unmarshal(tc.data, &want); err != nil {
				t.Fatal(err)
			}
			got, err := mdmplist.TopLevelStrings(tc.data, mdmplist.DefaultLimits, "Status", "CommandUUID", "MessageType")
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"Status", "CommandUUID", "MessageType"} {
				w, ok := want[k]
				if g, gok := got[k]; ok != gok || ok && g != w {
					t.Errorf("%s: got %q (%v), micromdm/plist %q (%v)", k, g, gok, w, ok)
				}
			}
		})
	}
}

func TestXMLAndBinaryOfOneResultReadTheSame(t *testing.T) {
	t.Parallel()
	for _, v := range []map[string]any{
		plisttest.Result("Error", "U-1", "D-1"),
		plisttest.Result("NotNow", "U-2", "D-2"),
		plisttest.InstalledApplicationList(20, "U-3", "D-3"),
	} {
		x, errX := mdmplist.TopLevelStrings([]byte(plisttest.XMLDocument(v)), mdmplist.DefaultLimits, "Status", "CommandUUID", "UDID")
		b, errB := mdmplist.TopLevelStrings(plisttest.Encode(v), mdmplist.DefaultLimits, "Status", "CommandUUID", "UDID")
		if errX != nil || errB != nil || !reflect.DeepEqual(x, b) || x["UDID"] != v["UDID"] {
			t.Errorf("xml %q %v, binary %q %v", x, errX, b, errB)
		}
	}
}

// Every hostile plist is refused, with a one-line error saying why, and
// at once.
func TestTopLevelStringsRefusesHostilePlists(t *testing.T) {
	t.Parallel()
	for _, tc := range plisttest.Hostile() {
		t.Run(tc.Name, func(t *testing.T) {
			refusedQuickly(t, tc.Data, mdmplist.DefaultLimits, tc.Want)
		})
	}
}

func refusedQuickly(t *testing.T, data []byte, lim mdmplist.Limits, want string) {
	t.Helper()
	start := time.Now()
	got, err := mdmplist.TopLevelStrings(data, lim, "Status", "CommandUUID")
	took := time.Since(start)
	if err == nil {
		t.Fatalf("accepted, read %q", got)
	}
	if msg := err.Error(); !strings.Contains(msg, want) || strings.ContainsAny(msg, "\r\n") {
		t.Errorf("error %q, want one line containing %q", msg, want)
	}
	// linear: a second, and a second more per MiB read (under -race; ten
	// times less without)
	if budget := time.Second + time.Duration(len(data)>>20)*time.Second; took > budget {
		t.Errorf("took %v to refuse %d bytes", took, len(data))
	}
}

func TestTopLevelStringsRefusesHugeXML(t *testing.T) {
	t.Parallel()
	const body = 32 << 20 // the webhook's largest body
	deepPrefix := `<plist><dict><key>Status</key><string>A</string><key>Deep</key>`
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"32 MiB of <array>", bytes.Repeat([]byte("<array>"), body/7), "root is <array>, not a dict"},
		{"32 MiB of <array> in a dict", append([]byte(deepPrefix), bytes.Repeat([]byte("<array>"), body/7)...), "plist nested deeper than 128 levels"},
		{"100000 levels", plisttest.DeepXML(100000), "plist nested deeper than 128 levels"},
		{"129 levels", plisttest.DeepXML(128), "plist nested deeper than 128 levels"},
		{"1<<20+1 elements", []byte(`<plist><dict><key>a</key><array>` + strings.Repeat("<true/>", 1<<20) + `</array></dict></plist>`), "plist has more than 1048576 elements"},
	} {
		t.Run(tc.name, func(t *testing.T) { refusedQuickly(t, tc.data, mdmplist.DefaultLimits, tc.want) })
	}
	// 127 arrays under the root dict: 128 levels, the most there may be.
	if _, err := mdmplist.TopLevelStrings(plisttest.DeepXML(127), mdmplist.DefaultLimits); err != nil {
		t.Errorf("128 levels: %v", err)
	}
}

// XML and binary count levels and elements alike: the same value passes
// both at the same limits and fails both one below.
func TestLimitsCountXMLAndBinaryAlike(t *testing.T) {
	t.Parallel()
	var deep any = "leaf"
	for i := 0; i < 9; i++ {
		deep = []any{deep, map[string]any{"k": 1}}
	}
	values := []map[string]any{
		plisttest.Result("Error", "U", "D"),
		{"Status": "Acknowledged", "Deep": deep},
		{"Shared": []any{}, "E": map[string]any{}},
	}
	for i, v := range values {
		docs := map[string][]byte{"xml": []byte(plisttest.XMLDocument(v)), "binary": plisttest.Encode(v)}
		least := func(doc []byte, lim func(n int) mdmplist.Limits) int {
			for n := 1; n < 10000; n++ {
				if _, err := mdmplist.TopLevelStrings(doc, lim(n)); err == nil {
					return n
				}
			}
			return -1
		}
		depth := func(n int) mdmplist.Limits { return mdmplist.Limits{MaxDepth: n} }
		elements := func(n int) mdmplist.Limits { return mdmplist.Limits{MaxElements: n} }
		if x, b := least(docs["xml"], depth), least(docs["binary"], depth); x != b || x < 1 {
			t.Errorf("value %d: least depth xml %d, binary %d", i, x, b)
		}
		if x, b := least(docs["xml"], elements), least(docs["binary"], elements); x != b || x < 1 {
			t.Errorf("value %d: least elements xml %d, binary %d", i, x, b)
		}
	}
	// a shared binary object counts once per reference, as in a tree
	shared := plisttest.Build(1, plisttest.Dict(1, 1, 2), plisttest.ASCII("A"), plisttest.Array(1, 3, 3, 3), plisttest.Array(1, 4, 4), plisttest.Bool(true))
	// dict 1 + key 1 + array 1 + 3 × (array 1 + 2 × bool 1) = 12
	if _, err := mdmplist.TopLevelStrings(shared, mdmplist.Limits{MaxElements: 12}); err != nil {
		t.Errorf("12 elements within 12: %v", err)
	}
	refusedQuickly(t, shared, mdmplist.Limits{MaxElements: 11}, "plist has more than 11 elements")
}

// A large real result, 3000 installed apps (about 2 MiB of XML), passes
// well within the limits.
func TestLargeResultPasses(t *testing.T) {
	t.Parallel()
	v := plisttest.InstalledApplicationList(3000, "U-apps", "D-1")
	for name, doc := range map[string][]byte{"xml": []byte(plisttest.XMLDocument(v)), "binary": plisttest.Encode(v)} {
		start := time.Now()
		got, err := mdmplist.TopLevelStrings(doc, mdmplist.DefaultLimits, "Status", "CommandUUID")
		if err != nil || got["Status"] != "Acknowledged" || got["CommandUUID"] != "U-apps" {
			t.Errorf("%s: %q %v", name, got, err)
		}
		t.Logf("%s: %d KiB in %v", name, len(doc)>>10, time.Since(start))
	}
}

func TestErrorsSayWhatIsWrong(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		data []byte
		want string
	}{
		{plisttest.Build(1, plisttest.Dict(1, 1, 2, 3, 4), plisttest.ASCII("Status"), plisttest.ASCII("A"), plisttest.ASCII("List"), append(plisttest.Header(0xA, 1<<40), make([]byte, 52)...)),
			"binary plist: array at object 4 claims 1099511627776 elements, more than the 52 bytes left"},
		{plisttest.Build(1, plisttest.Array(1, 0)), "binary plist: object 0 contains itself"},
		{[]byte("bplist00\x00"), "binary plist: 9 bytes is too short (a binary plist has at least 42)"},
		{[]byte(`<plist><array/></plist>`), "xml plist: the plist's root is <array>, not a dict (at byte 15)"},
		{[]byte("<plist>\n<dict>\n<key>a</key>\n</plist>"), "xml plist: <dict> closed by </plist> (at byte 36)"},
		{[]byte(`<?xml version="1.0" encoding="ISO-8859-1"?><plist><dict/></plist>`), `xml plist: xml: opening charset "ISO-8859-1": only UTF-8 is read (what devices send)`},
	} {
		_, err := mdmplist.TopLevelStrings(tc.data, mdmplist.DefaultLimits, "Status")
		if err == nil || err.Error() != tc.want {
			t.Errorf("error %v, want %s", err, tc.want)
		}
	}
}

// The hostile plists are kept as the fuzz target's corpus (the crashers of
// micromdm/plist); `go test -run Corpus -update` rewrites them.
func TestCorpusKeepsEveryHostilePlist(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "fuzz", "FuzzTopLevelStrings")
	for _, tc := range plisttest.Hostile() {
		file := filepath.Join(dir, tc.Name)
		want := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", tc.Data)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(file, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(file)
		if err != nil || string(got) != want {
			t.Errorf("%s is missing or stale (%v): run go test ./internal/mdmplist -run Corpus -update", file, err)
		}
	}
}

// A typical result: a DeviceInformation answer of about 2 KiB.
func typicalResult() []byte {
	v := plisttest.Result("Acknowledged", "0b1d2f4a-9c1e-4a57-8f3b-6c2d1e0f9a8b", "0000FE00-5A1B2C3D4E5F6071")
	q := v["QueryResponses"].(map[string]any)
	for _, k := range []string{"ProductName", "Model", "ModelName", "IMEI", "MEID", "ICCID", "EthernetMAC", "BluetoothMAC", "CarrierSettingsVersion", "CurrentCarrierNetwork", "PhoneNumber", "SubscriberCarrierNetwork"} {
		q[k] = "value of " + k
	}
	q["TotalDiskCapacity"], q["IsCloudBackupEnabled"], q["IsDeviceLocatorServiceEnabled"] = 994.66, false, true
	return []byte(plisttest.XMLDocument(v))
}

func BenchmarkTopLevelStrings(b *testing.B) {
	for _, doc := range benchDocs() {
		b.Run(doc.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc.data)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := mdmplist.TopLevelStrings(doc.data, mdmplist.DefaultLimits, "Status", "CommandUUID"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkMicromdmUnmarshal(b *testing.B) {
	for _, doc := range benchDocs() {
		b.Run(doc.name, func(b *testing.B) {
			b.SetBytes(int64(len(doc.data)))
			b.ReportAllocs()
			for b.Loop() {
				var r struct{ Status, CommandUUID string }
				if err := plist.Unmarshal(doc.data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type benchDoc struct {
	name string
	data []byte
}

func benchDocs() []benchDoc {
	typical := typicalResult()
	return []benchDoc{
		{fmt.Sprintf("xml-%dB", len(typical)), typical},
		{"binary-typical", plisttest.Encode(plisttest.Result("Acknowledged", "U", "D"))},
		{"xml-3000-apps", []byte(plisttest.XMLDocument(plisttest.InstalledApplicationList(3000, "U", "D")))},
	}
}
