// Package e2e drives the built binaries from outside, through the contract
// alone, as NanoMDM and a workflow engine would.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/scrape"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

var bins map[string]string

func TestMain(m *testing.M) {
	testkit.Main(m, "STEPCOLLECT_E2E_BINDIR", true, func(b map[string]string) { bins = b }, "cmd/api", "cmd/worker")
}

const (
	apiKey  = "e2e-api-key"
	hmacKey = "e2e-hmac-key"
)

// stack is one API, one worker, a fresh database and a private Redis.
type stack struct {
	db         *testkit.DB
	redis      *testkit.Redis
	api        *testkit.Proc
	worker     *testkit.Proc
	apiURL     string
	metricsURL string
}

func startStack(t *testing.T) *stack {
	t.Helper()
	s := &stack{db: testkit.NewDB(t, nil), redis: testkit.StartRedis(t)}
	apiAddr, workerAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	env := []string{"STEPCOLLECT_MYSQL_DSN=" + s.db.DSN, "STEPCOLLECT_REDIS_URL=" + s.redis.URL, "STEPCOLLECT_LOG_LEVEL=warn"}
	s.worker = testkit.StartProc(t, bins["worker"], env, "-metrics-listen", workerAddr)
	s.metricsURL = "http://" + workerAddr + "/metrics"
	testkit.AwaitHTTP(t, s.worker, "http://"+workerAddr+"/readyz", 20*time.Second)
	s.api = testkit.StartProc(t, bins["api"], append(env, "STEPCOLLECT_API_KEY="+apiKey, "STEPCOLLECT_WEBHOOK_HMAC_KEY="+hmacKey), "-listen", apiAddr)
	s.apiURL = "http://" + apiAddr
	testkit.AwaitHTTP(t, s.api, s.apiURL+"/readyz", 20*time.Second)
	return s
}

func (s *stack) v1(t *testing.T, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, s.apiURL+path, rd)
	req.Header.Set("Authorization", "Bearer "+apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out
}

func resultPlist(udid, uuid string) []byte {
	return []byte(fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict>
<key>CommandUUID</key><string>%s</string><key>Status</key><string>Acknowledged</string>
<key>UDID</key><string>%s</string>
<key>QueryResponses</key><dict><key>SerialNumber</key><string>SN-%s</string></dict>
</dict></plist>`, uuid, udid, udid))
}

// A step to 500 enrollments over HTTP, the 500 results at once through
// NanoMDM's own webhook sender: every one answered 200, the step gone
// within seconds, and exactly one step.completed event per enrollment in
// the outbox, each with that enrollment's result.
func TestFanOutOf500ThroughTheRealBinaries(t *testing.T) {
	s := startStack(t)
	const n = 500
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("E2E-%04d", i)
	}
	status, body := s.v1(t, "POST", "/v1/steps", map[string]any{
		"workflow_name": "io.example.e2e", "instance_id": "run-1", "step_name": "inventory", "ids": ids,
		"commands": []map[string]string{{"command_uuid": "E2E-CMD-1", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}},
	})
	if status != http.StatusCreated {
		t.Fatalf("enqueue: %d %v", status, body)
	}
	stepID := int64(body["step_id"].(float64))

	sender := webhook.New(s.apiURL+"/webhook", webhook.WithHMACSecret([]byte(hmacKey)))
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	release := make(chan struct{})
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			r := mdm.NewRequestWithContext(context.Background(), nil)
			r.EnrollID = &mdm.EnrollID{ID: id, Type: mdm.Device}
			_, err := sender.CommandAndReportResults(r, &mdm.CommandResults{
				Enrollment: mdm.Enrollment{UDID: id}, CommandUUID: "E2E-CMD-1", Status: "Acknowledged", Raw: resultPlist(id, "E2E-CMD-1"),
			})
			if err != nil {
				mu.Lock()
				failures = append(failures, id+": "+err.Error())
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	close(release)
	wg.Wait()
	t.Logf("500 results answered in %v", time.Since(start).Round(time.Millisecond))
	if len(failures) > 0 {
		t.Fatalf("%d results not answered 200, first: %s", len(failures), failures[0])
	}

	deadline := time.Now().Add(15 * time.Second)
	for {
		status, _ := s.v1(t, "GET", fmt.Sprintf("/v1/steps/%d", stepID), nil)
		if status == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("step %d still there (%d) 15s after the last result", stepID, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("step collected %v after the first result", time.Since(start).Round(time.Millisecond))

	rows, err := s.db.Query(`SELECT enrollment_id, event_type, payload FROM stepcollect_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	seen := map[string]int{}
	for rows.Next() {
		var id, typ string
		var payload []byte
		if err := rows.Scan(&id, &typ, &payload); err != nil {
			t.Fatal(err)
		}
		var ev events.Event
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatal(err)
		}
		seen[id]++
		if typ != events.StepCompleted || ev.Step.StepID != stepID || len(ev.Step.IDs) != 1 || ev.Step.IDs[0] != id ||
			len(ev.Step.Commands) != 1 || !strings.Contains(string(ev.Step.Commands[0].Result), "SN-"+id) {
			t.Errorf("%s: event %s %+v", id, typ, ev)
		}
	}
	if len(seen) != n {
		t.Errorf("events for %d enrollments, want %d", len(seen), n)
	}
	for id, c := range seen {
		if c != 1 {
			t.Errorf("%s: %d events", id, c)
		}
	}
	left := testkit.Count(t, s.db.DB, `SELECT (SELECT COUNT(*) FROM steps) + (SELECT COUNT(*) FROM id_commands) + (SELECT COUNT(*) FROM step_commands)`)
	if left != 0 {
		t.Errorf("%d step rows left", left)
	}

	fams, err := scrape.Families(s.apiURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := scrape.Value(fams, "stepcollect_results_total", "outcome", "completed_step"); got != n {
		t.Errorf("api results_total{completed_step} = %v, want %d", got, n)
	}
	wf, err := scrape.Families(s.metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	if got := scrape.Value(wf, "stepcollect_steps_collected_total"); got != 1 {
		t.Errorf("worker steps_collected_total = %v, want 1", got)
	}
	if err := s.api.Stop(); err != nil {
		t.Errorf("api on SIGTERM: %v", err)
	}
	if err := s.worker.Stop(); err != nil {
		t.Errorf("worker on SIGTERM: %v", err)
	}
}

// Every metric name the contract lists is exported by both binaries.
func TestBothBinariesExportTheContractsMetrics(t *testing.T) {
	s := startStack(t)
	names := []string{
		"stepcollect_results_total", "stepcollect_result_commit_seconds", "stepcollect_enqueue_failures_total",
		"stepcollect_steps_collected_total", "stepcollect_collect_runs_total", "stepcollect_collection_lag_seconds",
		"stepcollect_uncollected_steps", "asynq_queue_size", "asynq_queue_latency_seconds",
		"go_goroutines", "process_resident_memory_bytes",
	}
	for name, url := range map[string]string{"api": s.apiURL + "/metrics", "worker": s.metricsURL} {
		fams, err := scrape.Families(url)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range names {
			if _, ok := fams[m]; !ok {
				t.Errorf("%s does not export %s", name, m)
			}
		}
	}
}
