package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testdb"
	"github.com/stepcollect/stepcollect/internal/testproc"
	"github.com/stepcollect/stepcollect/internal/testredis"
)

var apiBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stepcollect-api-test")
	if err != nil {
		panic(err)
	}
	bins, err := testproc.Build(dir, "cmd/api")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	apiBin = bins["api"]
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func TestAPIStopsCleanlyOnSIGTERM(t *testing.T) {
	db := testdb.New(t, nil)
	rs := testredis.Start(t)
	addr := testproc.FreeAddr(t)
	p := testproc.Start(t, apiBin, []string{"STEPCOLLECT_MYSQL_DSN=" + db.DSN, "STEPCOLLECT_REDIS_URL=" + rs.URL}, "-listen", addr)
	testproc.AwaitHTTP(t, p, "http://"+addr+"/healthz", 20*time.Second)
	if err := p.Stop(); err != nil {
		t.Fatalf("api exited with %v on SIGTERM:\n%s", err, p.Logs())
	}
}

func TestAPIReadyzNamesRedisWhenItIsDown(t *testing.T) {
	db := testdb.New(t, nil)
	rs := testredis.Start(t)
	addr := testproc.FreeAddr(t)
	p := testproc.Start(t, apiBin, []string{"STEPCOLLECT_MYSQL_DSN=" + db.DSN, "STEPCOLLECT_REDIS_URL=" + rs.URL}, "-listen", addr)
	testproc.AwaitHTTP(t, p, "http://"+addr+"/readyz", 20*time.Second)
	rs.Kill()
	out, err := exec.Command("curl", "-s", "-w", " %{http_code}", "http://"+addr+"/readyz").Output()
	if err != nil {
		t.Skipf("curl: %v", err)
	}
	if s := string(out); !strings.HasSuffix(s, " 503") || !strings.Contains(s, "redis:") || strings.Contains(s, "mysql:") {
		t.Errorf("readyz with Redis down: %q, want 503 naming redis only", s)
	}
}

func TestAPIRejectsABadFlagInOneLineNamingIt(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"-listen", "nowhere"}, "", "-listen: "},
		{[]string{"-mysql-dsn", "nonsense"}, "", "-mysql-dsn: "},
		{[]string{"-redis-url", "ftp://x"}, "", "-redis-url: "},
		{nil, "STEPCOLLECT_MIGRATE=maybe", "-migrate: STEPCOLLECT_MIGRATE=\"maybe\""},
		{[]string{"-log-format", "xml"}, "", "-log-format: "},
		{[]string{"-max-body-bytes", "10"}, "", "-max-body-bytes: "},
	} {
		cmd := exec.Command(apiBin, tc.args...)
		cmd.Env = append(os.Environ(), tc.env)
		out, err := cmd.CombinedOutput()
		line := strings.TrimSpace(string(out))
		if err == nil || strings.Contains(line, "\n") || !strings.Contains(line, tc.want) {
			t.Errorf("%v %s: %v %q, want one line containing %q", tc.args, tc.env, err, line, tc.want)
		}
	}
}

// Pointed at a database that does not exist yet, with -migrate on, the api
// creates it, migrates it and serves.
func TestAPICreatesTheDatabaseWhenItIsMissing(t *testing.T) {
	db := testdb.New(t, nil)
	fresh := db.Name + "_fresh"
	t.Cleanup(func() { db.Exec("DROP DATABASE IF EXISTS " + fresh) })
	dsn := strings.Replace(db.DSN, "/"+db.Name+"?", "/"+fresh+"?", 1)
	rs := testredis.Start(t)
	addr := testproc.FreeAddr(t)
	p := testproc.Start(t, apiBin, []string{"STEPCOLLECT_MYSQL_DSN=" + dsn, "STEPCOLLECT_REDIS_URL=" + rs.URL}, "-listen", addr)
	testproc.AwaitHTTP(t, p, "http://"+addr+"/readyz", 20*time.Second)
	var tables int
	db.QueryRow(`SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = ?`, fresh).Scan(&tables)
	if tables < 7 {
		t.Errorf("%d tables in the created database, want the schema's 7", tables)
	}
}
