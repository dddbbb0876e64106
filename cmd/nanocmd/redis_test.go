package main_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// With -redis-url, nanocmd collects nothing itself: each commit's released
// steps go through the hand-off onto the queue, and stepcollect's worker
// (its sweeps off, so that only the handed-over tasks can collect)
// collects them. Before the worker runs, the answered steps stay; once it
// runs, they go, and its scheduler leaves NanoCMD's steps alone.
func TestWithARedisURLTheWorkerCollectsTheSteps(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	rds := testkit.StartRedis(t)
	s := startMySQL(t, db, "-redis-url", rds.URL)
	runInventory(t, s, 10)

	// nothing collects them yet: not nanocmd (no inline collection, no
	// sweep), and no worker runs
	time.Sleep(2 * time.Second)
	// (the workflow is one step for the ten enrollments: answered, it is
	// unreferenced, and its steps row is what collection deletes)
	if rows := testkit.CountStepRows(t, db.DB); rows != (testkit.StepRows{Steps: 1}) {
		t.Fatalf("step rows %+v with no worker running, want the answered step's row still there: nanocmd collected it itself", rows)
	}

	w, _ := testkit.StartService(t, bins["worker"], testkit.ServiceEnv(db.DSN, rds.URL, "STEPCOLLECT_SWEEP_INTERVAL=0"), "metrics-listen")
	testkit.WaitUntil(t, 15*time.Second, "the worker collected every step", func() (bool, any) {
		rows := testkit.CountStepRows(t, db.DB)
		return rows == testkit.StepRows{}, rows
	})
	// the scheduler runs at its next 10 s slot (-schedule-interval), which
	// may come after the collection: wait for it, not for a guessed while
	testkit.WaitUntil(t, 15*time.Second, "the worker's scheduler saying it leaves this database's steps to NanoCMD's engine", func() (bool, any) {
		return strings.Contains(w.Logs(), "scheduler idle on this database"), w.Logs()
	})
	if logs := s.proc.Logs(); strings.Contains(logs, `"level":"error"`) {
		t.Errorf("nanocmd logged an error:\n%s", logs)
	}
}

// -redis-url goes with -storage mysql only, and a URL that is not one is
// refused at start, naming the flag.
func TestARedisURLIsRefusedWithoutMySQLOrWhenMalformed(t *testing.T) {
	testkit.CheckRefuses(t, bins["nanocmd"], []testkit.BadFlag{
		{Args: []string{"-storage", "inmem", "-redis-url", "redis://127.0.0.1:6379/0"}, Want: "-redis-url: only with -storage mysql"},
		{Args: []string{"-storage", "mysql", "-storage-dsn", "root@tcp(127.0.0.1:1)/x", "-redis-url", "http://user:hunter2@x"}, Want: "-redis-url", Hide: []string{"hunter2"}},
	})
}
