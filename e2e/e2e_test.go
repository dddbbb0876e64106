// Package e2e drives the built binaries from outside, through what
// docs/reference.md documents alone, as NanoMDM and a workflow engine would.
package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

func TestMain(m *testing.M) {
	testkit.MainServices(m, "STEPCOLLECT_E2E_BINDIR", true)
}

const (
	apiKey  = "e2e-api-key"
	hmacKey = "e2e-hmac-key"
)

// startStack is one API and one worker on a fresh database and a private
// Redis.
func startStack(t *testing.T) *testkit.Stack {
	t.Helper()
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	return testkit.StartStack(t, testkit.StackConfig{
		DSN: db.DSN, RedisURL: rs.URL, DB: db.DB, APIKey: apiKey,
		Env: []string{"STEPCOLLECT_LOG_LEVEL=warn"}, APIEnv: []string{"STEPCOLLECT_WEBHOOK_HMAC_KEY=" + hmacKey},
	})
}

// A step to 500 enrollments over HTTP, the 500 results at once through
// NanoMDM's own webhook sender: every one answered 200, the step gone
// within seconds, and exactly one step.completed event per enrollment in
// the outbox, each with that enrollment's result.
func TestFanOutOf500ThroughTheRealBinaries(t *testing.T) {
	s := startStack(t)
	const n = 500
	step, ids := testkit.V1FanOut("E2E", n)
	step["commands"] = []map[string]string{{"command_uuid": "E2E-CMD", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}}
	stepID := s.Client.MustEnqueue(t, step)

	start := time.Now()
	failures := testkit.SendResults(s.APIURL+"/webhook", []byte(hmacKey), "E2E-CMD", ids)
	t.Logf("500 results answered in %v", time.Since(start).Round(time.Millisecond))
	if len(failures) > 0 {
		t.Fatalf("%d results not answered 200, first: %v", len(failures), failures[0])
	}

	testkit.WaitUntil(t, 15*time.Second, fmt.Sprintf("GET /v1/steps/%d to answer 404 after the last result (its status)", stepID), func() (bool, any) {
		status, _ := s.Client.V1(t, "GET", fmt.Sprintf("/v1/steps/%d", stepID), nil)
		return status == http.StatusNotFound, status
	})
	t.Logf("step collected %v after the first result", time.Since(start).Round(time.Millisecond))

	rows, err := s.DB.Query(`SELECT enrollment_id, event_type, payload FROM stepcollect_outbox`)
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
	if left := testkit.CountStepRows(t, s.DB); left != (testkit.StepRows{}) {
		t.Errorf("step rows left: %+v", left)
	}

	fams, err := scrape.Families(s.APIURL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if got := scrape.Value(fams, "stepcollect_results_total", "outcome", "completed_step"); got != n {
		t.Errorf("api results_total{completed_step} = %v, want %d", got, n)
	}
	wf, err := scrape.Families(s.MetricsURL())
	if err != nil {
		t.Fatal(err)
	}
	if got := scrape.Value(wf, "stepcollect_steps_collected_total"); got != 1 {
		t.Errorf("worker steps_collected_total = %v, want 1", got)
	}
	s.Stop(t)
}

// Every metric name docs/reference.md lists is exported by both binaries.
func TestBothBinariesExportTheDocumentedMetrics(t *testing.T) {
	s := startStack(t)
	names := []string{
		"stepcollect_results_total", "stepcollect_result_commit_seconds", "stepcollect_enqueue_failures_total",
		"stepcollect_steps_collected_total", "stepcollect_collect_runs_total", "stepcollect_collection_lag_seconds",
		"stepcollect_uncollected_steps", "asynq_queue_size", "asynq_queue_latency_seconds",
		"go_goroutines", "process_resident_memory_bytes",
	}
	for name, url := range map[string]string{"api": s.APIURL + "/metrics", "worker": s.MetricsURL()} {
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
