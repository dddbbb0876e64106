package main_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// get is a GET without the API key: its status and body.
func (h *hub) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get(h.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// /healthz, /readyz and /metrics answer without the API key; /readyz is
// 503 naming MySQL once it cannot be reached, /healthz still 200; the
// metrics count the results committed.
func TestHealthReadinessAndMetricsOnMySQL(t *testing.T) {
	h := startHub(t, hubOptions{N: 5, DBProxy: true})
	if code, body := h.get(t, "/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q, want 200 \"ok\\n\"", code, body)
	}
	if code, body := h.get(t, "/readyz"); code != http.StatusOK || !strings.Contains(body, "mysql: ok") {
		t.Errorf("/readyz: %d %q, want 200 with \"mysql: ok\"", code, body)
	}
	ids := h.fleet.IDs()
	h.mustStart(t, inventory, "", ids...)
	testkit.WaitUntil(t, 30*time.Second, "the inventory", func() (bool, any) { n := h.inventoried(t, ids); return n == len(ids), n })
	fams, err := scrape.Families(h.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if n := scrape.Value(fams, "stepcollect_result_commit_seconds"); n < float64(2*len(ids)) {
		t.Errorf("stepcollect_result_commit_seconds_count %v, want the %d results committed", n, 2*len(ids))
	}
	for _, name := range []string{"stepcollect_build_info", "stepcollect_sweeps_total", "stepcollect_mdm_push_failures_total", "go_sql_open_connections", "process_cpu_seconds_total"} {
		if fams[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}

	h.dbProxy.Cut()
	if code, body := h.get(t, "/readyz"); code != http.StatusServiceUnavailable || !strings.HasPrefix(body, "mysql: ") || strings.Contains(body, "mysql: ok") {
		t.Errorf("/readyz with MySQL unreachable: %d %q, want 503 naming mysql", code, body)
	}
	if code, _ := h.get(t, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with MySQL unreachable: %d, want 200", code)
	}
}
