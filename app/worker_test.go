package app_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

// workerBundle is a test database, a private Redis, and a results-side
// storage that hands released steps to the queue, as the API does.
type workerBundle struct {
	db      *testkit.DB
	redis   *testkit.Redis
	results *stepmysql.Storage
	enq     *tasks.Enqueuer
}

func setupWorker(t *testing.T) *workerBundle {
	t.Helper()
	rs := testkit.StartRedis(t)
	redisOpt, err := asynq.ParseRedisURI(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	// the worker's queues are named by the database, made just below
	ns := tasks.NewNamespace(tasks.QueueNames{})
	enq := tasks.NewEnqueuer(redisOpt, tasks.WithCooldown(100*time.Millisecond), tasks.WithNamespace(ns))
	t.Cleanup(func() { enq.Close() })
	db, results := testkit.NewStorage(t, stepmysql.WithReleaseSink(enq))
	v, err := stepmysql.QueueNamespace(t.Context(), db.DB)
	if err != nil {
		t.Fatal(err)
	}
	ns.Set(tasks.NamesFor(v))
	return &workerBundle{db: db, redis: rs, results: results, enq: enq}
}

// startWorker runs an in-process worker replica until the test ends and
// returns its metrics URL.
func startWorker(t *testing.T, b *workerBundle, sweep time.Duration) string {
	t.Helper()
	cfg := app.WorkerConfig{
		MySQLDSN: b.db.DSN, RedisURL: b.redis.URL, Migrate: true, MetricsListen: "127.0.0.1:0",
		Concurrency: 8, SweepInterval: sweep, ShutdownTimeout: 2 * time.Second, MySQLPool: stepmysql.Pool{MaxConns: 16},
	}
	logger := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := app.NewWorker(ctx, cfg, logger)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("worker: %v", err)
		}
	})
	return "http://" + w.MetricsAddr() + "/metrics"
}

// awaitEmpty waits until the step tables are empty, failing t with what
// is left after within, and returns how long it took.
func awaitEmpty(t *testing.T, db *sql.DB, within time.Duration, what string) time.Duration {
	t.Helper()
	return testkit.WaitUntil(t, within, what+": the step tables emptied", func() (bool, any) {
		c := testkit.CountStepRows(t, db)
		return c == (testkit.StepRows{}), c
	})
}

// reportAll sends every enrollment's result at the same moment and fails the
// test on any error or any enrollment not completed.
func reportAll(t *testing.T, s *stepmysql.Storage, st *nanostorage.StepEnqueuingWithConfig) {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	release := make(chan struct{})
	for _, id := range st.IDs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			r, err := s.StoreCommandResponseAndRetrieveCompletedStep(context.Background(), id, testkit.CommandResult(st.Commands[0].CommandUUID))
			if err == nil && r == nil {
				err = fmt.Errorf("%s: not completed", id)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		}()
	}
	close(release)
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
}

// With the sweeper off, the queue alone must collect every step: the
// dedup must never swallow the enqueue that mattered. Twenty rounds, so a
// rare race between a finishing task and a rejected duplicate shows.
func TestFanOutOf300CollectedThroughTheQueueWithTheSweeperOff(t *testing.T) {
	b := setupWorker(t)
	metricsURL := startWorker(t, b, 0)
	for round := range 20 {
		st := testkit.FanOut(fmt.Sprintf("r%02d", round), 300, 1)
		if err := b.results.StoreStep(t.Context(), st, time.Now()); err != nil {
			t.Fatal(err)
		}
		reportAll(t, b.results, st)
		awaitEmpty(t, b.db.DB, 10*time.Second, fmt.Sprintf("round %d", round))
	}
	// the counters move just after the deletes commit: wait for them
	var fams map[string]*dto.MetricFamily
	testkit.WaitUntil(t, 10*time.Second, "the worker to count 20 collected steps and their lag: {collected, lag count}", func() (bool, any) {
		var err error
		if fams, err = scrape.Families(metricsURL); err != nil {
			t.Fatal(err)
		}
		got := [2]float64{scrape.Value(fams, "stepcollect_steps_collected_total"), scrape.Value(fams, "stepcollect_collection_lag_seconds")}
		return got[0] >= 20 && got[1] >= 20, got
	})
	if got := scrape.Value(fams, "stepcollect_steps_collected_total"); got != 20 {
		t.Errorf("worker collected %v steps, want 20", got)
	}
	if got := scrape.Value(fams, "stepcollect_sweeps_total"); got != 0 {
		t.Errorf("%v sweeps ran with the sweeper off", got)
	}
	if got := scrape.Value(fams, "stepcollect_collection_lag_seconds"); got != 20 {
		t.Errorf("lag observed for %v steps, want 20", got)
	}
}

// Redis dies while results are being committed: every result must still be
// committed, and once Redis is back the sweeper collects everything within
// about one interval.
func TestRedisKilledDuringCommitsThenTheSweeperCollectsAfterItReturns(t *testing.T) {
	b := setupWorker(t)
	const interval = 2 * time.Second
	startWorker(t, b, interval)

	b.redis.Kill()
	for i := range 3 {
		st := testkit.FanOut(fmt.Sprintf("down%d", i), 100, 1)
		if err := b.results.StoreStep(t.Context(), st, time.Now()); err != nil {
			t.Fatal(err)
		}
		reportAll(t, b.results, st) // no error: a hand-off failure never fails a result
	}
	if c := testkit.CountStepRows(t, b.db.DB); c != (testkit.StepRows{Steps: 3}) {
		t.Fatalf("with Redis down: %+v, want the 3 unreferenced steps and nothing else", c)
	}

	b.redis.Restart()
	// one interval, plus asynq's reconnect and poll, which are about a second each
	took := awaitEmpty(t, b.db.DB, interval+5*time.Second, "after Redis returned")
	t.Logf("collected %v after Redis returned (sweep interval %v)", took, interval)
}

// Two replicas with the sweeper on: each unreferenced step is deleted once,
// and one sweep runs per interval, not one per replica.
func TestTwoReplicasDeleteEachStepOnceAndSweepOncePerInterval(t *testing.T) {
	b := setupWorker(t)
	const interval = time.Second

	// 100 steps whose hand-off was lost, for the sweepers to find
	lost := testkit.OpenStorage(t, b.db.DB, stepmysql.WithReleaseSink(testkit.DropReleases{}))
	for i := range 100 {
		st := testkit.FanOut(fmt.Sprintf("lost%03d", i), 2, 1)
		if err := lost.StoreStep(t.Context(), st, time.Now()); err != nil {
			t.Fatal(err)
		}
		reportAll(t, lost, st)
	}

	start := time.Now()
	urls := []string{startWorker(t, b, interval), startWorker(t, b, interval)}
	// and 20 more through the queue while both run
	for i := range 20 {
		st := testkit.FanOut(fmt.Sprintf("live%02d", i), 20, 1)
		if err := b.results.StoreStep(t.Context(), st, time.Now()); err != nil {
			t.Fatal(err)
		}
		reportAll(t, b.results, st)
	}
	awaitEmpty(t, b.db.DB, 10*time.Second, "120 steps with two replicas")
	var collected, sweeps float64
	read := func() {
		collected, sweeps = 0, 0
		for _, u := range urls {
			fams, err := scrape.Families(u)
			if err != nil {
				t.Fatal(err)
			}
			collected += scrape.Value(fams, "stepcollect_steps_collected_total")
			sweeps += scrape.Value(fams, "stepcollect_sweeps_total", "trigger", "periodic")
		}
	}
	// let three more slots pass with both replicas up: three more sweeps
	read()
	before := sweeps
	testkit.WaitUntil(t, 10*interval, fmt.Sprintf("three more sweeps than %v with both replicas up", before), func() (bool, any) {
		read()
		return sweeps >= before+3, sweeps
	})
	if collected != 120 {
		t.Errorf("steps deleted across replicas: %v, want each of the 120 exactly once", collected)
	}
	// every slot the replicas were up in, partial ones at both ends included
	end := time.Now()
	slots := float64(end.Truncate(interval).Sub(start.Truncate(interval))/interval) + 1
	if sweeps > slots || sweeps < slots-2 {
		t.Errorf("%v sweeps across 2 replicas over %v slots of %v: want one per slot", sweeps, slots, interval)
	}
	t.Logf("%v sweeps over %v slots of %v with 2 replicas", sweeps, slots, interval)
}
