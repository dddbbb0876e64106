package httpapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/storage"
)

func TestV1RequiresTheAPIKey(t *testing.T) {
	b := setup(t, nil)
	for _, tc := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", func(*http.Request) {}, 401},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, 401},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+apiKey) }, 404},
		{"basic, any user", func(r *http.Request) { r.SetBasicAuth("nanocmd", apiKey) }, 404},
		{"basic, wrong password", func(r *http.Request) { r.SetBasicAuth("x", "nope") }, 401},
	} {
		req, _ := http.NewRequest("GET", b.srv.URL+"/v1/steps/999", nil)
		tc.set(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}

	none := ""
	open := setup(t, &setupOpts{apiKey: &none})
	req, _ := http.NewRequest("GET", open.srv.URL+"/v1/steps/1", nil)
	req.Header.Set("Authorization", "Bearer ")
	resp, _ := http.DefaultClient.Do(req)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(string(raw), "set -api-key") {
		t.Errorf("with no key configured: %d %s, want 401 saying to set one", resp.StatusCode, raw)
	}
}

func TestV1StepsLifecycle(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "io.example.lifecycle", []string{"D1", "D2"}, "L-1")
	status, st := b.call(t, "GET", "/v1/steps/"+itoa(id), nil)
	if status != 200 || st["outstanding_ids"].(float64) != 2 || st["workflow_name"] != "io.example.lifecycle" || st["step_name"] != "query" || st["created_at"] == "" {
		t.Fatalf("status: %d %v", status, st)
	}
	if status, _ := b.call(t, "DELETE", "/v1/enrollments/D1/steps?workflow_name=other.workflow", nil); status != 204 {
		t.Fatalf("cancel of another workflow: %d", status)
	}
	if _, st := b.call(t, "GET", "/v1/steps/"+itoa(id), nil); st["outstanding_ids"].(float64) != 2 {
		t.Errorf("cancelling another workflow touched this one: %v", st)
	}
	if status, _ := b.call(t, "DELETE", "/v1/enrollments/D1/steps?workflow_name=io.example.lifecycle", nil); status != 204 {
		t.Fatalf("cancel: %d", status)
	}
	if _, st := b.call(t, "GET", "/v1/steps/"+itoa(id), nil); st["outstanding_ids"].(float64) != 1 {
		t.Errorf("after cancelling D1: %v", st)
	}
	if err := sendResult(b.sender(nil), "D2", "L-1", "Acknowledged"); err != nil {
		t.Fatal(err)
	}
	status, body := b.call(t, "GET", "/v1/steps/"+itoa(id), nil)
	if status != 404 || !strings.Contains(body["error"].(string), "no such step") {
		t.Errorf("after the last result: %d %v, want 404", status, body)
	}
}

func TestV1EnqueueRejectsBadStepsNamingTheFieldAndWritesNothing(t *testing.T) {
	b := setup(t, nil)
	b.enqueue(t, "wf.existing", []string{"HELD-1", "HELD-2"}, "HELD-UUID")
	before := snapshot(t, b.db.DB)
	step := func(mod func(m map[string]any)) map[string]any {
		m := map[string]any{
			"workflow_name": "wf", "instance_id": "i", "ids": []string{"A", "B"},
			"commands": []map[string]string{{"command_uuid": "U-1", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}},
		}
		mod(m)
		return m
	}
	for _, tc := range []struct {
		name string
		body any
		want int
		msg  string
	}{
		{"not json", "{", 400, "body: not JSON"},
		{"empty", "", 400, "body: empty"},
		{"unknown field", `{"workflowName":"x"}`, 400, `body: unknown field "workflowName"`},
		{"ids not a list", `{"ids":"A"}`, 400, "ids: want []string"},
		{"no workflow", step(func(m map[string]any) { delete(m, "workflow_name") }), 400, "workflow_name: missing"},
		{"no instance", step(func(m map[string]any) { delete(m, "instance_id") }), 400, "instance_id: missing"},
		{"empty ids", step(func(m map[string]any) { m["ids"] = []string{} }), 400, "ids: empty"},
		{"empty commands", step(func(m map[string]any) { m["commands"] = []any{} }), 400, "commands: empty"},
		{"repeated uuid", step(func(m map[string]any) {
			m["commands"] = []map[string]string{{"command_uuid": "U", "request_type": "X"}, {"command_uuid": "U", "request_type": "Y"}}
		}), 400, `commands[1].command_uuid: "U" repeats commands[0]`},
		{"bad base64", step(func(m map[string]any) { m["context"] = "!!" }), 400, "context: not standard base64"},
		{"bad time", step(func(m map[string]any) { m["timeout"] = "tomorrow" }), 400, `timeout: "tomorrow" is not an RFC 3339 time`},
		{"held uuid", step(func(m map[string]any) {
			m["ids"] = []string{"NEW-1", "HELD-2"}
			m["commands"] = []map[string]string{{"command_uuid": "HELD-UUID", "request_type": "DeviceInformation"}}
		}), 409, `enrollment "HELD-2" already holds command "HELD-UUID"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := b.call(t, "POST", "/v1/steps", tc.body)
			msg, _ := body["error"].(string)
			if status != tc.want || !strings.Contains(msg, tc.msg) || strings.Contains(msg, "\n") {
				t.Errorf("%d %q, want %d containing %q", status, msg, tc.want, tc.msg)
			}
		})
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Errorf("rejected steps changed the database")
	}
}

func TestV1StepWithNotUntilAndTimeoutIsStored(t *testing.T) {
	b := setup(t, nil)
	status, body := b.call(t, "POST", "/v1/steps", map[string]any{
		"workflow_name": "wf", "instance_id": "i", "ids": []string{"A"},
		"commands":  []map[string]string{{"command_uuid": "U-1", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}},
		"not_until": time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "timeout": time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339),
	})
	if status != 201 {
		t.Fatalf("%d %v", status, body)
	}
	if n := count(t, b.db.DB, `SELECT COUNT(*) FROM step_commands WHERE command = '<plist/>'`); n != 1 {
		t.Errorf("raw command not kept for the not_until step")
	}
	if n := count(t, b.db.DB, `SELECT COUNT(*) FROM steps WHERE not_until IS NOT NULL AND timeout IS NOT NULL`); n != 1 {
		t.Errorf("not_until/timeout not stored")
	}
}

// panicStore panics where the API expects a step id.
type panicStore struct{ httpapi.Store }

func (panicStore) StoreStepID(context.Context, *nanostorage.StepEnqueuingWithConfig, time.Time) (int64, error) {
	panic("boom")
}

func (panicStore) StepStatus(context.Context, int64) (*storage.StepStatus, error) { return nil, nil }

func TestAPanicIsA500WithTheRequestIDLogged(t *testing.T) {
	var logs strings.Builder
	h := httpapi.New(httpapi.Config{Store: panicStore{}, APIKey: apiKey, Logger: zerolog.New(&logs)})
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/steps", strings.NewReader(`{"workflow_name":"w","instance_id":"i","ids":["A"],"commands":[{"command_uuid":"U","request_type":"R"}]}`))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set(httpapi.RequestIDHeader, "req-123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var eb struct {
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
	}
	json.NewDecoder(resp.Body).Decode(&eb)
	resp.Body.Close()
	if resp.StatusCode != 500 || eb.RequestID != "req-123" || resp.Header.Get(httpapi.RequestIDHeader) != "req-123" {
		t.Errorf("%d %+v, want 500 carrying request id req-123", resp.StatusCode, eb)
	}
	if !strings.Contains(logs.String(), `"request_id":"req-123"`) || !strings.Contains(logs.String(), `"panic":"boom"`) {
		t.Errorf("panic not logged with its request id:\n%s", logs.String())
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
