package main_test

import (
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/scrape"
	"github.com/stepcollect/stepcollect/internal/testkit"
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
	return testkit.StartProc(t, workerBin, []string{
		"STEPCOLLECT_MYSQL_DSN=" + dsn, "STEPCOLLECT_REDIS_URL=" + redisURL,
		"STEPCOLLECT_METRICS_LISTEN=" + addr, "STEPCOLLECT_SWEEP_INTERVAL=" + sweep.String(),
	}, "-concurrency", "4", "-log-level", "warn"), "http://" + addr + "/metrics"
}

func countSteps(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps) + (SELECT COUNT(*) FROM id_commands) + (SELECT COUNT(*) FROM step_commands)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A worker killed with SIGKILL in the middle of collecting leaves tasks
// "active" in Redis that asynq only hands back after their lease expires
// and its recoverer runs, a minute or two later. The restarted worker's
// sweeper collects their steps long before that.
func TestWorkerKilledMidBatchAndRestartedCollectsEverything(t *testing.T) {
	db := testkit.NewDB(t, nil)
	ctx := t.Context()
	if err := stepmysql.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	rs := testkit.StartRedis(t)
	redisOpt, _ := asynq.ParseRedisURI(rs.URL)
	enq := tasks.NewEnqueuer(redisOpt)
	defer enq.Close()
	results, err := stepmysql.New(stepmysql.WithDB(db.DB), stepmysql.WithCollector(enq))
	if err != nil {
		t.Fatal(err)
	}

	const steps = 1500
	var ids []string
	for i := range steps {
		st := &nanostorage.StepEnqueuingWithConfig{}
		st.WorkflowName, st.InstanceID = "io.stepcollect.kill", fmt.Sprint(i)
		st.IDs = []string{fmt.Sprintf("KILL-%05d", i)}
		st.Commands = []nanostorage.StepCommandRaw{{CommandUUID: fmt.Sprintf("KILL-UUID-%05d", i), RequestType: "DeviceInformation"}}
		if err := results.StoreStep(ctx, st, time.Now()); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, st.IDs[0])
	}
	const sweep = 2 * time.Second
	w := startWorkerProc(t, db.DSN, rs.URL, sweep)

	// every result at once: 1500 collect tasks for the worker
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			r, err := results.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, &nanostorage.StepCommandResult{
				CommandUUID: fmt.Sprintf("KILL-UUID-%05d", i), Completed: true, ResultReport: []byte("<plist/>")})
			if err != nil || r == nil {
				t.Errorf("%s: %v, %v", id, r, err)
			}
		}()
	}
	wg.Wait()

	// kill it once it is visibly part-way through
	deadline := time.Now().Add(30 * time.Second)
	for left := countSteps(t, db.DB); left == steps || left == 0; left = countSteps(t, db.DB) {
		if left == 0 {
			t.Fatal("the worker collected everything before it could be killed; raise steps")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker collected nothing in 30s:\n%s", w.Logs())
		}
		time.Sleep(5 * time.Millisecond)
	}
	w.Kill()
	left := countSteps(t, db.DB)
	insp := asynq.NewInspector(redisOpt)
	defer insp.Close()
	active, _ := insp.ListActiveTasks(tasks.QueueCollect)
	pending, _ := insp.ListPendingTasks(tasks.QueueCollect, asynq.PageSize(10000))
	t.Logf("killed with %d steps left, %d tasks orphaned active, %d pending", left, len(active), len(pending))

	restarted := time.Now()
	startWorkerProc(t, db.DSN, rs.URL, sweep)
	for countSteps(t, db.DB) > 0 {
		// the lease-based recovery alone would take over a minute; the
		// sweeper must do it within a few intervals
		if time.Since(restarted) > 10*sweep {
			t.Fatalf("%d steps still uncollected %v after restart", countSteps(t, db.DB), time.Since(restarted))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("everything collected %v after the restart", time.Since(restarted).Round(time.Millisecond))
}

func TestWorkerStopsCleanlyOnSIGTERM(t *testing.T) {
	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	w, metricsURL := startWorkerProcAt(t, db.DSN, rs.URL, time.Second)
	// stop it once it has visibly done a sweep task, so that the stop
	// interrupts a worker at work, not one still starting
	deadline := time.Now().Add(15 * time.Second)
	for {
		fams, err := scrape.Families(metricsURL)
		if err == nil && scrape.Value(fams, "stepcollect_sweeps_total") >= 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no sweep within 15s (last scrape error %v):\n%s", err, w.Logs())
		}
		time.Sleep(20 * time.Millisecond)
	}
	start := time.Now()
	if err := w.Stop(); err != nil {
		t.Fatalf("worker exited with %v on SIGTERM:\n%s", err, w.Logs())
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("stopping took %v, past asynq's shutdown timeout", took)
	}
}

func TestWorkerRejectsABadFlagInOneLineNamingIt(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{[]string{"-sweep-interval", "soon"}, "", `-sweep-interval`},
		{[]string{"-mysql-dsn", "nonsense"}, "", "-mysql-dsn: "},
		{[]string{"-redis-url", "http://example"}, "", "-redis-url: "},
		{nil, "STEPCOLLECT_SWEEP_INTERVAL=zz", "-sweep-interval: STEPCOLLECT_SWEEP_INTERVAL=\"zz\""},
		{[]string{"-metrics-listen", "nowhere"}, "", "-metrics-listen: "},
	} {
		cmd := exec.Command(workerBin, tc.args...)
		cmd.Env = os.Environ()
		if tc.env != "" {
			cmd.Env = append(cmd.Env, tc.env)
		}
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("%v %s: started", tc.args, tc.env)
			continue
		}
		line := strings.TrimSpace(string(out))
		if strings.Count(line, "\n") > 0 || !strings.Contains(line, tc.want) {
			t.Errorf("%v %s: said %q, want one line containing %q", tc.args, tc.env, line, tc.want)
		}
	}
}
