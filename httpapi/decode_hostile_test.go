package httpapi_test

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/mdmplist/plisttest"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
)

// ackBody is a result webhook for DEV-1 whose raw_payload is raw.
func ackBody(raw []byte) string {
	return `{"topic":"mdm.Connect","event_id":"e","acknowledge_event":{"udid":"DEV-1","raw_payload":"` + base64.StdEncoding.EncodeToString(raw) + `"}}`
}

// Every hostile raw_payload is a 400 naming the field and saying what is
// wrong with the plist, at once; none reaches a decoder that would die of
// it.
func TestDecodeWebhookRefusesHostilePlists(t *testing.T) {
	cases := plisttest.Hostile()
	cases = append(cases,
		plisttest.Case{Name: "xml-nested-100000-deep", Data: plisttest.DeepXML(100000), Want: "plist nested deeper than 128 levels"},
		plisttest.Case{Name: "xml-24-MiB-of-arrays", Data: []byte(`<plist><dict><key>a</key>` + strings.Repeat("<array>", 24<<20/7)), Want: "plist nested deeper than 128 levels"},
	)
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			body := []byte(ackBody(tc.Data))
			start := time.Now()
			ev, err := httpapi.DecodeWebhook(body)
			took := time.Since(start)
			if err == nil {
				t.Fatalf("accepted: %+v", ev)
			}
			msg := err.Error()
			if storage.ErrorCode(err) != storage.EInvalid || !strings.HasPrefix(msg, "acknowledge_event.raw_payload: not a plist: ") ||
				!strings.Contains(msg, tc.Want) || strings.ContainsAny(msg, "\r\n") {
				t.Errorf("error %q (%s), want an invalid-input error naming acknowledge_event.raw_payload and saying %q", msg, storage.ErrorCode(err), tc.Want)
			}
			// JSON and base64 are read whole (linear, about 20 ms per MiB
			// under -race, alone); the plist is refused as soon as it is
			// wrong. The bound is for liveness, wide enough for a loaded
			// CI machine (5.3 s for 32 MiB was seen beside other packages):
			// what it catches is the minutes of a superlinear decoder.
			if len(body) > 1<<20 {
				t.Logf("refused a %d KiB body in %v", len(body)>>10, took)
			}
			if budget := 5*time.Second + time.Duration(len(body)>>20)*500*time.Millisecond; took > budget {
				t.Errorf("took %v for a %d-byte body", took, len(body))
			}
		})
	}
	// the same plists as check-ins
	for _, tc := range plisttest.Hostile()[:3] {
		body := `{"topic":"mdm.CheckOut","checkin_event":{"udid":"DEV-1","raw_payload":"` + base64.StdEncoding.EncodeToString(tc.Data) + `"}}`
		if _, err := httpapi.DecodeWebhook([]byte(body)); storage.ErrorCode(err) != storage.EInvalid || !strings.HasPrefix(err.Error(), "checkin_event.raw_payload: not a plist: ") {
			t.Errorf("check-in %s: %v", tc.Name, err)
		}
	}
}

// Binary plists are results and check-ins like XML ones.
func TestDecodeWebhookReadsBinaryPlists(t *testing.T) {
	ev, err := httpapi.DecodeWebhook([]byte(ackBody(plisttest.ResultBinary("Error", "U-bin", "DEV-1"))))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Action != httpapi.CommitResult || ev.Status != "Error" || ev.CommandUUID != "U-bin" || ev.EnrollmentID != "DEV-1" || string(ev.Raw) != string(plisttest.ResultBinary("Error", "U-bin", "DEV-1")) {
		t.Errorf("decoded %+v", ev)
	}
	checkout := plisttest.Encode(map[string]any{"MessageType": "CheckOut", "UDID": "DEV-1"})
	ev, err = httpapi.DecodeWebhook([]byte(`{"topic":"mdm.CheckOut","checkin_event":{"udid":"DEV-1","raw_payload":"` + base64.StdEncoding.EncodeToString(checkout) + `"}}`))
	if err != nil || ev.Action != httpapi.CancelEnrollment || ev.EnrollmentID != "DEV-1" {
		t.Errorf("check-out: %+v %v", ev, err)
	}
}

// raw_payload is decoded from base64 straight out of the body; what is
// said of a bad one is what was said when it was first read as a string.
func TestDecodeWebhookRawPayloadErrors(t *testing.T) {
	good := base64.StdEncoding.EncodeToString(testkit.ResultPlist("DEV-1", "U-1", "Acknowledged"))
	ack := func(raw string) string {
		return `{"topic":"mdm.Connect","acknowledge_event":{"udid":"DEV-1","command_uuid":"U-1","raw_payload":` + raw + `}}`
	}
	for _, tc := range []struct{ body, want string }{
		{ack(`5`), "acknowledge_event.raw_payload: want string, got a JSON number"},
		{ack(`true`), "acknowledge_event.raw_payload: want string, got a JSON bool"},
		{ack(`["x"]`), "acknowledge_event.raw_payload: want string, got a JSON array"},
		{ack(`{"a":1}`), "acknowledge_event.raw_payload: want string, got a JSON object"},
		{`{"topic":"mdm.CheckOut","checkin_event":{"raw_payload":7}}`, "checkin_event.raw_payload: want string, got a JSON number"},
		{`{"topic":"mdm.Connect","acknowledge_event":"x"}`, "acknowledge_event: want an object, got a JSON string"},
		{`{"topic":"mdm.Connect","acknowledge_event":{"udid":["D"]}}`, "acknowledge_event.udid: want string, got a JSON array"},
		{ack(`null`), "acknowledge_event.raw_payload: missing"},
		{ack(`""`), "acknowledge_event.raw_payload: missing"},
		{ack(`"%%%"`), "acknowledge_event.raw_payload: not standard base64: illegal base64 data at input byte 0"},
		{ack(`"` + good[:8] + `\u00e9"`), "acknowledge_event.raw_payload: not standard base64: illegal base64 data at input byte 8"},
		{ack(`"` + good[:8] + "\xff" + `"`), "body: not UTF-8 at byte 103 (0xff); JSON must be UTF-8"},
		// encoding/json would take the byte for U+FFFD: another enrollment
		{`{"topic":"mdm.Connect","acknowledge_event":{"udid":"DEV-` + "\xc3" + `","command_uuid":"U-1","raw_payload":"` + good + `"}}`,
			"body: not UTF-8 at byte 56 (0xc3); JSON must be UTF-8"},
		{ack(`"` + good[:5] + `"`), "acknowledge_event.raw_payload: not standard base64: illegal base64 data at input byte 4"},
		{ack(`"ICAg"`), "acknowledge_event.raw_payload: empty"},
	} {
		_, err := httpapi.DecodeWebhook([]byte(tc.body))
		if storage.ErrorCode(err) != storage.EInvalid || err.Error() != tc.want {
			t.Errorf("%s:\n got %v\nwant %s", tc.body, err, tc.want)
		}
	}
	// escaped JSON (a slash as \/, as some encoders write it) still decodes
	escaped := strings.ReplaceAll(good, "/", `\/`)
	if !strings.Contains(escaped, `\/`) {
		escaped = `\u0050` + good[1:] // good starts with "P" (<?xml)
	}
	ev, err := httpapi.DecodeWebhook([]byte(ack(`"` + escaped + `"`)))
	if err != nil || ev.Status != "Acknowledged" {
		t.Errorf("escaped: %+v %v", ev, err)
	}
}

// A result of about 1.4 MiB (3000 installed apps): raw_payload is decoded
// from the body without a copy of its base64 text first.
func BenchmarkDecodeWebhook(b *testing.B) {
	body := []byte(ackBody([]byte(plisttest.XMLDocument(plisttest.InstalledApplicationList(3000, "U-1", "DEV-1")))))
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := httpapi.DecodeWebhook(body); err != nil {
			b.Fatal(err)
		}
	}
}
