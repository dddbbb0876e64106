package httpapi_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// post sends body to path and returns the status and the error line.
func post(t *testing.T, b *bundle, path string, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest("POST", b.srv.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var eb struct {
		Error string `json:"error"`
	}
	json.Unmarshal(raw, &eb)
	return resp.StatusCode, eb.Error
}

// Against the server's own max_allowed_packet: a 13 MiB result, whose
// step.completed would not fit, is a 413 naming the limit (never a 503,
// which NanoMDM would not resend), and nothing is written; so is a
// not_until step of two 7 MiB commands, whose step.due would not fit.
func TestResultsAndStepsWhoseEventsWouldNotFitAre413NamingTheLimit(t *testing.T) {
	b := setup(t, nil)
	b.enqueue(t, "wf", []string{"DEV-1"}, "U-1")
	before := snapshot(t, b.db.DB)
	limit := strconv.Itoa(b.store.MaxPacket())

	pad := strings.Repeat("p", 13<<20)
	raw := bytes.Replace(testkit.ResultPlist("DEV-1", "U-1", "Acknowledged"), []byte("<key>Status</key>"), []byte("<key>Pad</key><string>"+pad+"</string><key>Status</key>"), 1)
	status, msg := post(t, b, "/webhook", testkit.WebhookBody("DEV-1", "U-1", raw))
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "max_allowed_packet") || !strings.Contains(msg, limit) {
		t.Errorf("a 13 MiB result: %d %q, want 413 naming max_allowed_packet (%s bytes)", status, msg, limit)
	}

	command := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("c"), 7<<20))
	step, err := json.Marshal(map[string]any{
		"workflow_name": "wf", "instance_id": "big", "ids": []string{"DEV-2"}, "not_until": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"commands": []map[string]string{
			{"command_uuid": "B-1", "request_type": "InstallProfile", "command": command},
			{"command_uuid": "B-2", "request_type": "InstallProfile", "command": command},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	status, msg = post(t, b, "/v1/steps", step)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "step.due") || !strings.Contains(msg, limit) {
		t.Errorf("two 7 MiB commands due at once: %d %q, want 413 naming the step.due and max_allowed_packet (%s bytes)", status, msg, limit)
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Errorf("refused inputs changed the database:\n before %s\n after  %s", before, after)
	}
}
