package httpapi_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
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

// bigParts is how many results or commands of how many bytes (at most
// most of a 16 MiB column) the server's packet takes one by one but not as
// one event's base64: for a 16 MiB packet one 13 MiB result, or two 7 MiB
// commands.
func bigParts(packet, most int) (n, size int) {
	size = min(packet*most/16, most<<20)
	return packet/(size/3*4) + 1, size
}

// Against the server's own max_allowed_packet: the result whose
// step.completed would not fit (13 MiB at 16 MiB) is a 413 naming the
// limit (never a 503, which NanoMDM would not resend), and nothing is
// written; so is a not_until step whose step.due would not fit (two 7 MiB
// commands). The body limit is raised to carry them.
func TestResultsAndStepsWhoseEventsWouldNotFitAre413NamingTheLimit(t *testing.T) {
	db := testkit.NewDB(t, nil)
	packet := testkit.Count(t, db.DB, `SELECT @@max_allowed_packet`)
	b := setup(t, &setupOpts{db: db, maxBody: int64(2 * packet)})
	limit := strconv.Itoa(b.store.MaxPacket())

	results, size := bigParts(packet, 13)
	var uuids []string
	for i := range results {
		uuids = append(uuids, fmt.Sprintf("U-%d", i))
	}
	b.enqueue(t, "wf", []string{"DEV-1"}, uuids...)
	pad := strings.Repeat("p", size)
	result := func(uuid string) []byte {
		raw := bytes.Replace(testkit.ResultPlist("DEV-1", uuid, "Acknowledged"), []byte("<key>Status</key>"), []byte("<key>Pad</key><string>"+pad+"</string><key>Status</key>"), 1)
		return testkit.WebhookBody("DEV-1", uuid, raw)
	}
	for _, uuid := range uuids[:results-1] {
		if status, msg := post(t, b, "/webhook", result(uuid)); status != http.StatusOK {
			t.Fatalf("a result of %d bytes, its event not yet due: %d %q", size, status, msg)
		}
	}
	before := snapshot(t, b.db.DB)
	status, msg := post(t, b, "/webhook", result(uuids[results-1]))
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "max_allowed_packet") || !strings.Contains(msg, limit) {
		t.Errorf("the last of %d results of %d bytes: %d %q, want 413 naming max_allowed_packet (%s bytes)", results, size, status, msg, limit)
	}

	n, size := bigParts(packet, 7)
	command := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("c"), size))
	var commands []map[string]string
	for i := range n {
		commands = append(commands, map[string]string{"command_uuid": fmt.Sprintf("B-%d", i), "request_type": "InstallProfile", "command": command})
	}
	step, err := json.Marshal(map[string]any{
		"workflow_name": "wf", "instance_id": "big", "ids": []string{"DEV-2"}, "not_until": time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"commands": commands,
	})
	if err != nil {
		t.Fatal(err)
	}
	status, msg = post(t, b, "/v1/steps", step)
	if status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, "step.due") || !strings.Contains(msg, limit) {
		t.Errorf("%d commands of %d bytes due at once: %d %q, want 413 naming the step.due and max_allowed_packet (%s bytes)", n, size, status, msg, limit)
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Errorf("refused inputs changed the database:\n before %s\n after  %s", before, after)
	}
}
