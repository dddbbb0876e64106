package main_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/internal/mdmplist/plisttest"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

// A hostile plist in any webhook's raw_payload is refused with a 400 naming
// it before NanoCMD's handler decodes it, and the process lives on: that
// decoder dies on some of them (a binary dict that contains itself: a fatal
// stack overflow; an array claiming 2^40 elements: out of memory), which
// without a key anyone could send.
func TestHostilePlistsInWebhooksAreRefusedAndNanoCMDLives(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db, "-webhook-hmac-key", "")
	post := func(body []byte) (int, string) {
		t.Helper()
		resp, err := http.Post(s.base+"/webhook", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatalf("the process stopped answering: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	cases := plisttest.Hostile()
	for _, topic := range []string{"mdm.TokenUpdate", "mdm.Authenticate", "mdm.Connect"} {
		for _, c := range cases {
			payload := map[string]any{"udid": "DEV-1", "raw_payload": base64.StdEncoding.EncodeToString(c.Data)}
			event := map[string]any{"topic": topic, "event_id": "e", "created_at": "2026-12-07T00:00:00Z"}
			if topic == "mdm.Connect" {
				payload["command_uuid"], payload["status"] = "U-1", "Acknowledged"
				event["acknowledge_event"] = payload
			} else {
				event["checkin_event"] = payload
			}
			body, _ := json.Marshal(event)
			code, msg := post(body)
			if code != http.StatusBadRequest || !strings.Contains(msg, "raw_payload: not a plist") || strings.Contains(msg, "\n") {
				t.Errorf("%s %s: %d %q, want a one-line 400 naming raw_payload", topic, c.Name, code, msg)
			}
		}
	}
	if code, _ := s.do(t, "GET", "/healthz", false); code != http.StatusOK {
		t.Errorf("after %d hostile webhooks: healthz %d, want 200", 3*len(cases), code)
	}
	if err := answer(webhook.New(s.base+"/webhook"), "DEV-1", enqueued{"U-1", "DeviceInformation"}); err != nil {
		t.Errorf("a well-formed webhook after them: %v, want 200", err)
	}
}
