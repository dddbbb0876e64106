package main_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

var apiBin string

func TestMain(m *testing.M) {
	testkit.Main(m, "", true, func(b map[string]string) { apiBin = b["api"] }, "cmd/api")
}

func TestAPIStopsCleanlyOnSIGTERM(t *testing.T) {
	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	p, _ := testkit.StartService(t, apiBin, testkit.ServiceEnv(db.DSN, rs.URL), "listen")
	if err := p.Stop(); err != nil {
		t.Fatalf("api exited with %v on SIGTERM:\n%s", err, p.Logs())
	}
}

// The api commits results without Redis, so a load balancer must not pull
// it for a Redis outage: /readyz stays 200 and says Redis is down, and
// stepcollect_redis_up says so too.
func TestAPIStaysReadyWhileRedisIsDownAndSaysSo(t *testing.T) {
	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	p, url := testkit.StartService(t, apiBin, testkit.ServiceEnv(db.DSN, rs.URL), "listen")
	rs.Kill()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatalf("readyz with Redis down: %v (is the api alive?)\n%s", err, p.Logs())
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if s := string(body); resp.StatusCode != http.StatusOK || !strings.Contains(s, "mysql: ok") || !strings.Contains(s, "redis: down") {
		t.Errorf("readyz with Redis down: %d %q, want 200 with mysql ok and redis down", resp.StatusCode, s)
	}
	fams, err := scrape.Families(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if up := scrape.Value(fams, "stepcollect_redis_up"); up != 0 {
		t.Errorf("stepcollect_redis_up = %v with Redis down, want 0", up)
	}
	if up := scrape.Value(fams, "stepcollect_mysql_up"); up != 1 {
		t.Errorf("stepcollect_mysql_up = %v, want 1", up)
	}
}

// Pointed at a database that does not exist yet, with -migrate on, the api
// creates it, migrates it and serves.
func TestAPICreatesTheDatabaseWhenItIsMissing(t *testing.T) {
	db := testkit.NewDB(t, nil)
	fresh := db.Name + "_fresh"
	t.Cleanup(func() { db.Exec("DROP DATABASE IF EXISTS " + fresh) })
	dsn := strings.Replace(db.DSN, "/"+db.Name+"?", "/"+fresh+"?", 1)
	rs := testkit.StartRedis(t)
	testkit.StartService(t, apiBin, testkit.ServiceEnv(dsn, rs.URL), "listen")
	tables := testkit.Count(t, db.DB, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?`, fresh)
	if tables < 7 {
		t.Errorf("%d tables in the created database, want the schema's 7", tables)
	}
}

// Started with -migrate=false on a database nobody migrated (a deployment
// whose migrate job has not run yet), the api can answer nothing but 503s:
// /readyz says so, naming the schema and what to do, until the schema is
// there; then it is ready without a restart.
func TestAPIIsNotReadyUntilTheSchemaIsMigrated(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	rs := testkit.StartRedis(t)
	addr := testkit.FreeAddr(t)
	p := testkit.StartProc(t, apiBin, append(testkit.ServiceEnv(db.DSN, rs.URL), "STEPCOLLECT_MIGRATE=false"), "-listen", addr)
	readyz := func() (int, string) {
		t.Helper()
		var code int
		var body string
		testkit.WaitUntil(t, 15*time.Second, "an answer from /readyz (error)", func() (bool, any) {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return false, err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			code, body = resp.StatusCode, string(b)
			return true, nil
		})
		return code, body
	}
	if code, body := readyz(); code != http.StatusServiceUnavailable ||
		!strings.Contains(body, "mysql: schema: not migrated") || !strings.Contains(body, "-migrate=true") {
		t.Fatalf("readyz on an unmigrated database: %d %q, want 503 naming the schema and -migrate\n%s", code, body, p.Logs())
	}
	if err := mysql.Migrate(t.Context(), db.DB); err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(); code != http.StatusOK || !strings.Contains(body, "mysql: ok") {
		t.Errorf("readyz once migrated: %d %q, want 200", code, body)
	}
}
