package main_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
	"github.com/stepcollect/stepcollect/internal/testkit/tcpproxy"
)

// On -storage mysql, /healthz, /readyz (pinging MySQL) and /metrics answer
// without the API key, and a workflow's results show in the storage's and
// the webhook's metrics beside the build's, the pool's and the runtime's.
func TestHealthReadinessAndMetricsOnMySQLWithoutTheAPIKey(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	if code, body := s.do(t, "GET", "/healthz", false); code != http.StatusOK || string(body) != "ok\n" {
		t.Errorf("/healthz: %d %q, want 200 \"ok\\n\"", code, body)
	}
	if code, body := s.do(t, "GET", "/readyz", false); code != http.StatusOK || !strings.Contains(string(body), "mysql: ok") {
		t.Errorf("/readyz: %d %q, want 200 with \"mysql: ok\"", code, body)
	}

	runInventory(t, s, 1)
	fams, err := scrape.Families(s.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if n := scrape.Value(fams, "stepcollect_result_commit_seconds"); n < 2 {
		t.Errorf("stepcollect_result_commit_seconds_count %v, want the 2 results committed", n)
	}
	if n := scrape.Value(fams, "stepcollect_http_requests_total", "handler", "webhook", "code", "200"); n < 2 {
		t.Errorf("stepcollect_http_requests_total{handler=webhook,code=200} %v, want 2", n)
	}
	if n := scrape.Value(fams, "stepcollect_http_requests_total", "handler", "engine"); n < 1 {
		t.Errorf("stepcollect_http_requests_total{handler=engine} %v, want the workflow start counted", n)
	}
	for _, name := range []string{"stepcollect_build_info", "stepcollect_sweeps_total", "go_sql_open_connections", "go_goroutines", "process_cpu_seconds_total"} {
		if fams[name] == nil {
			t.Errorf("/metrics has no %s", name)
		}
	}
	if n := scrape.Value(fams, "go_sql_open_connections", "db_name", "stepcollect"); n < 1 {
		t.Errorf("go_sql_open_connections{db_name=stepcollect} %v, want the storage's pool", n)
	}
}

// With MySQL unreachable, /readyz answers 503 naming mysql, and /healthz
// still 200: the process runs, it cannot do its job.
func TestReadyzAnswers503NamingMySQLWhenTheDatabaseIsUnreachable(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.Start(t, cfg.Addr)
	cfg.Net, cfg.Addr = "tcp", proxy.Addr
	s := start(t, "-storage", "mysql", "-storage-dsn", cfg.FormatDSN())
	if code, body := s.do(t, "GET", "/readyz", false); code != http.StatusOK {
		t.Fatalf("/readyz before the cut: %d %q, want 200", code, body)
	}

	proxy.Cut()
	code, body := s.do(t, "GET", "/readyz", false)
	if code != http.StatusServiceUnavailable || !strings.HasPrefix(string(body), "mysql: ") || strings.Contains(string(body), "mysql: ok") {
		t.Errorf("/readyz with MySQL unreachable: %d %q, want 503 naming mysql", code, body)
	}
	if code, _ := s.do(t, "GET", "/healthz", false); code != http.StatusOK {
		t.Errorf("/healthz with MySQL unreachable: %d, want 200", code)
	}
}

// On NanoCMD's own storages /readyz names the storage and is ready; with
// -redis-url, Redis down is in /readyz's body but not a 503 (results commit
// without it), and the hand-off's failures are counted.
func TestReadyzNamesTheStorageAndRedisIsInformational(t *testing.T) {
	t.Run("inmem", func(t *testing.T) {
		s := start(t, "-storage", "inmem")
		if code, body := s.do(t, "GET", "/readyz", false); code != http.StatusOK || string(body) != "storage: inmem\n" {
			t.Errorf("/readyz: %d %q, want 200 \"storage: inmem\\n\"", code, body)
		}
		if fams, err := scrape.Families(s.base + "/metrics"); err != nil || fams["stepcollect_build_info"] == nil {
			t.Errorf("/metrics: %v, stepcollect_build_info %v", err, fams["stepcollect_build_info"])
		}
	})
	t.Run("redis down", func(t *testing.T) {
		db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
		s := startMySQL(t, db, "-redis-url", "redis://"+testkit.FreeAddr(t)+"/0")
		code, body := s.do(t, "GET", "/readyz", false)
		if code != http.StatusOK || !strings.Contains(string(body), "mysql: ok") || !strings.Contains(string(body), "redis: down (not needed to be ready)") {
			t.Errorf("/readyz with Redis down: %d %q, want 200 with mysql ok and redis down", code, body)
		}
		if fams, err := scrape.Families(s.base + "/metrics"); err != nil || fams["stepcollect_enqueue_failures_total"] == nil {
			t.Errorf("/metrics: %v; stepcollect_enqueue_failures_total %v, want the hand-off's counter", err, fams["stepcollect_enqueue_failures_total"])
		}
	})
}
