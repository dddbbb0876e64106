package main_test

import (
	"database/sql"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

var workerBin string

func TestMain(m *testing.M) {
	testkit.Main(m, "", true, func(b map[string]string) { workerBin = b["worker"] }, "cmd/worker")
}

func startWorkerProc(t *testing.T, dsn, redisURL string, sweep time.Duration) *testkit.Proc {
	t.Helper()
	p, _ := startWorkerProcAt(t, dsn, redisURL, sweep)
	return p
}

// startWorkerProcAt also returns the worker's /metrics URL.
func startWorkerProcAt(t *testing.T, dsn, redisURL string, sweep time.Duration) (*testkit.Proc, string) {
	t.Helper()
	addr := testkit.FreeAddr(t)
	return testkit.StartProc(t, workerBin, testkit.ServiceEnv(dsn, redisURL,
		"STEPCOLLECT_METRICS_LISTEN="+addr, "STEPCOLLECT_SWEEP_INTERVAL="+sweep.String(),
	), "-concurrency", "4", "-log-level", "warn"), "http://" + addr + "/metrics"
}

// countSteps is every row of the three step tables.
func countSteps(t *testing.T, db *sql.DB) int {
	t.Helper()
	c := testkit.CountStepRows(t, db)
	return c.Steps + c.IDCommands + c.StepCommands
}

// A worker killed with SIGKILL in the middle of collecting leaves tasks
// "active" in Redis that asynq only hands back after their lease expires
// and its recoverer runs, a minute or two later. The restarted worker's
// sweeper collects their steps long before that.
func TestWorkerKilledMidBatchAndRestartedCollectsEverything(t *testing.T) {
	ctx := t.Context()
	rs := testkit.StartRedis(t)
	redisOpt, _ := asynq.ParseRedisURI(rs.URL)
	ns := tasks.NewNamespace(tasks.QueueNames{}) // the database's, read below
	enq := tasks.NewEnqueuer(redisOpt, tasks.WithNamespace(ns))
	defer enq.Close()
	db, results := testkit.NewStorage(t, stepmysql.WithReleaseSink(enq))
	v, err := stepmysql.QueueNamespace(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	ns.Set(tasks.NamesFor(v))

	const steps = 1500
	each := testkit.StepEach("KILL", steps)
	for _, st := range each {
		st.Commands[0].Command = nil // no raw command: a step is one row once its result is in
		if err := results.StoreStep(ctx, st, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	const sweep = 2 * time.Second
	w := startWorkerProc(t, db.DSN, rs.URL, sweep)

	// every result at once: 1500 collect tasks for the worker
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for _, st := range each {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			id := st.IDs[0]
			r, err := results.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(st.Commands[0].CommandUUID))
			if err != nil || r == nil {
				t.Errorf("%s: %v, %v", id, r, err)
			}
		}()
	}
	wg.Wait()

	// kill it once it is visibly part-way through
	testkit.WaitUntil(t, 30*time.Second, fmt.Sprintf("the worker part-way through the %d steps (step rows left)", steps), func() (bool, any) {
		left := countSteps(t, db.DB)
		if left == 0 {
			t.Fatal("the worker collected everything before it could be killed; raise steps")
		}
		return left != steps, left
	})
	w.Kill()
	left := countSteps(t, db.DB)
	insp := asynq.NewInspector(redisOpt)
	defer insp.Close()
	active, _ := insp.ListActiveTasks(ns.Names().Collect)
	pending, _ := insp.ListPendingTasks(ns.Names().Collect, asynq.PageSize(10000))
	t.Logf("killed with %d steps left, %d tasks orphaned active, %d pending", left, len(active), len(pending))

	startWorkerProc(t, db.DSN, rs.URL, sweep)
	// the lease-based recovery alone would take over a minute; the sweeper
	// must do it within a few intervals
	took := testkit.WaitUntil(t, 10*sweep, "every step collected after the restart (step rows left)", func() (bool, any) {
		left := countSteps(t, db.DB)
		return left == 0, left
	})
	t.Logf("everything collected %v after the restart", took.Round(time.Millisecond))
}

func TestWorkerStopsCleanlyOnSIGTERM(t *testing.T) {
	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	w, metricsURL := startWorkerProcAt(t, db.DSN, rs.URL, time.Second)
	// stop it once it has visibly done a sweep task, so that the stop
	// interrupts a worker at work, not one still starting
	testkit.WaitUntil(t, 15*time.Second, "a sweep (sweeps_total, or the scrape's error)", func() (bool, any) {
		fams, err := scrape.Families(metricsURL)
		if err != nil {
			return false, err
		}
		n := scrape.Value(fams, "stepcollect_sweeps_total", "trigger", "periodic")
		return n >= 1, n
	})
	start := time.Now()
	if err := w.Stop(); err != nil {
		t.Fatalf("worker exited with %v on SIGTERM:\n%s", err, w.Logs())
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("stopping took %v, past asynq's shutdown timeout", took)
	}
}

func TestWorkerRejectsABadFlagInOneLineNamingIt(t *testing.T) {
	testkit.CheckRefuses(t, workerBin, []testkit.BadFlag{
		{Args: []string{"-sweep-interval", "soon"}, Want: `-sweep-interval`},
		{Args: []string{"-mysql-dsn", "nonsense"}, Want: "-mysql-dsn: "},
		{Args: []string{"-redis-url", "http://example"}, Want: "-redis-url: "},
		{Env: "STEPCOLLECT_SWEEP_INTERVAL=zz", Want: "-sweep-interval: STEPCOLLECT_SWEEP_INTERVAL=\"zz\""},
		{Args: []string{"-metrics-listen", "nowhere"}, Want: "-metrics-listen: "},
		{Args: []string{"-push-url", "nanomdm/v1/push/"}, Want: "-push-url: "},
		{Args: []string{"-repush-interval", "-24h"}, Want: "-repush-interval: -24h0m0s is negative"},
		{Env: "STEPCOLLECT_REPUSH_INTERVAL=daily", Want: "-repush-interval: STEPCOLLECT_REPUSH_INTERVAL=\"daily\""},
	})
}

// -h says whether the push API key is set, never what it is.
func TestWorkerHelpShowsNoPushAPIKey(t *testing.T) {
	cmd := exec.Command(workerBin, "-h")
	cmd.Env = append(os.Environ(), "STEPCOLLECT_PUSH_API_KEY=push-s3cret", "STEPCOLLECT_PUSH_URL=http://nano:url-s3cret@nanomdm:9000/v1/push/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("-h: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "s3cret") {
		t.Errorf("-h shows a secret:\n%s", out)
	}
	for _, want := range []string{"-push-url", "-repush-interval", "(env STEPCOLLECT_PUSH_API_KEY) (set)", "http://xxxxx:xxxxx@nanomdm:9000/v1/push/"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-h lacks %q:\n%s", want, out)
		}
	}
}

// A refused URL or DSN names its flag without its user information, and
// the start log shows the callback URL with its credentials redacted.
func TestWorkerShowsNoPasswordInARefusalOrItsStartLog(t *testing.T) {
	hide := []string{"S3cretPw", "cbuser"}
	testkit.CheckRefuses(t, workerBin, []testkit.BadFlag{
		{Args: []string{"-redis-url", "redis://:S3cretPw@127.0.0.1:63x79/0"}, Want: "-redis-url: ", Hide: hide},
		{Env: "STEPCOLLECT_REDIS_URL=redis://cbuser:S3cretPw@127.0.0.1:6379/db", Want: "-redis-url: ", Hide: hide},
		{Args: []string{"-callback-url", "ftp://cbuser:S3cretPw@engine.example/cb"}, Want: "-callback-url: ", Hide: hide},
		{Args: []string{"-mysql-dsn", "stepcollect:S3cretPw@tcp(db:3306)/stepcollect?parseTime=maybe"}, Want: "-mysql-dsn: ", Hide: hide},
	})

	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	addr := testkit.FreeAddr(t)
	w := testkit.StartProc(t, workerBin, testkit.ServiceEnv(db.DSN, rs.URL), "-metrics-listen", addr,
		"-callback-url", "http://cbuser:S3cretPw@127.0.0.1:1/cb", "-log-level", "info")
	testkit.AwaitHTTP(t, w, "http://"+addr+"/readyz", 30*time.Second)
	testkit.WaitUntil(t, 15*time.Second, "the start log (worker started logged)", func() (bool, any) {
		return strings.Contains(w.Logs(), "worker started"), false
	})
	logs := w.Logs()
	if !strings.Contains(logs, `"callback_url":"http://xxxxx:xxxxx@127.0.0.1:1/cb"`) {
		t.Errorf("the start log lacks the redacted callback URL:\n%s", logs)
	}
	for _, secret := range hide {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs show %q:\n%s", secret, logs)
		}
	}
}

// Started with -migrate=false on a database nobody migrated, the worker
// cannot know its queues (the database names them): /readyz says why, and
// once the schema is there it serves the queue without a restart, collect
// tasks included (the sweeper is off, so only a collect task can collect).
func TestWorkerWaitsForTheSchemaThenServesItsQueue(t *testing.T) {
	ctx := t.Context()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	rs := testkit.StartRedis(t)
	addr := testkit.FreeAddr(t)
	p := testkit.StartProc(t, workerBin, testkit.ServiceEnv(db.DSN, rs.URL, "STEPCOLLECT_MIGRATE=false",
		"STEPCOLLECT_METRICS_LISTEN="+addr, "STEPCOLLECT_SWEEP_INTERVAL=0"), "-log-level", "warn")
	readyz := func(want int) string {
		t.Helper()
		var body string
		testkit.WaitUntil(t, 15*time.Second, fmt.Sprintf("/readyz to answer %d (status, body)", want), func() (bool, any) {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return false, err
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			return resp.StatusCode == want, fmt.Sprint(resp.StatusCode, " ", body)
		})
		return body
	}
	if body := readyz(503); !strings.Contains(body, "schema: not migrated") {
		t.Fatalf("readyz on an unmigrated database: %q, want it to name the schema\n%s", body, p.Logs())
	}
	if err := stepmysql.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	readyz(200)

	ns, err := stepmysql.QueueNamespace(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	redisOpt, _ := asynq.ParseRedisURI(rs.URL)
	enq := tasks.NewEnqueuer(redisOpt, tasks.WithNamespace(tasks.NewNamespace(tasks.NamesFor(ns))))
	defer enq.Close()
	results, err := stepmysql.New(stepmysql.WithDB(db.DB), stepmysql.WithReleaseSink(enq))
	if err != nil {
		t.Fatal(err)
	}
	st := testkit.StepEach("SCHEMA", 1)[0]
	if err := results.StoreStep(ctx, st, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := results.StoreCommandResponseAndRetrieveCompletedStep(ctx, st.IDs[0], testkit.CommandResult(st.Commands[0].CommandUUID)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitUntil(t, 15*time.Second, "the step collected by its collect task (step rows left)", func() (bool, any) {
		left := countSteps(t, db.DB)
		return left == 0, left
	})
}
