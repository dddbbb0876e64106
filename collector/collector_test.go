package collector_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

type bundle struct {
	db    *testkit.DB
	store *stepmysql.Storage
	m     *metrics.Storage
}

func setup(t *testing.T) *bundle {
	t.Helper()
	m := metrics.NewStorage(prometheus.NewRegistry())
	db, s := testkit.NewStorage(t, stepmysql.WithReleaseSink(testkit.DropReleases{}), stepmysql.WithObserver(m))
	return &bundle{db: db, store: s, m: m}
}

// storeStep stores a two-enrollment step and answers it for `answered` of them.
func (b *bundle) storeStep(t *testing.T, name string, answered int) int64 {
	t.Helper()
	st := testkit.FanOut(name, 2, 1)
	st.NotUntil = time.Now().Add(time.Hour) // with raw commands, which must go too
	id, err := b.store.StoreStepID(t.Context(), st, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	testkit.Complete(t, b.store, st, st.IDs[:answered]...)
	return id
}

func (b *bundle) exists(t *testing.T, stepID int64) (step, refs, raw int) {
	t.Helper()
	err := b.db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps WHERE id = ?), (SELECT COUNT(*) FROM id_commands WHERE step_id = ?), (SELECT COUNT(*) FROM step_commands WHERE step_id = ?)`,
		stepID, stepID, stepID).Scan(&step, &refs, &raw)
	if err != nil {
		t.Fatalf("rows of step %d: %v", stepID, err)
	}
	return
}

// The same collect task delivered twice (and twice at once): no error, the
// unreferenced step collected exactly once, and a referenced step named in
// the same payload left entirely alone.
func TestTheSameCollectTaskDeliveredTwiceIsHarmless(t *testing.T) {
	t.Parallel()
	b := setup(t)
	done := b.storeStep(t, "done", 2)    // unreferenced
	halfway := b.storeStep(t, "half", 1) // still referenced by B

	task, _, err := tasks.NewCollectTask(tasks.QueueCollect, []storage.ReleasedStep{
		{ID: done, ObservedAt: time.Now()}, {ID: halfway, ObservedAt: time.Now()}})
	if err != nil {
		t.Fatal(err)
	}
	referencedBefore := testutil.ToFloat64(b.m.CollectRuns.WithLabelValues("referenced"))
	h := collector.NewHandler(b.store, zerolog.New(zerolog.NewTestWriter(t)))
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range 2 { // two at once ...
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = h.ProcessTask(t.Context(), task) }()
	}
	wg.Wait()
	errs[2] = h.ProcessTask(t.Context(), task) // ... and again later
	errs[3] = h.ProcessTask(t.Context(), task)
	for i, err := range errs {
		if err != nil {
			t.Errorf("delivery %d: %v", i, err)
		}
	}
	if s, r, c := b.exists(t, done); s+r+c != 0 {
		t.Errorf("unreferenced step: step=%d refs=%d raw=%d left", s, r, c)
	}
	if s, r, c := b.exists(t, halfway); s != 1 || r != 1 || c != 1 {
		t.Errorf("referenced step touched: step=%d refs=%d raw=%d, want 1/1/1", s, r, c)
	}
	if got := testutil.ToFloat64(b.m.StepsCollectedTotal); got != 1 {
		t.Errorf("steps collected %v, want exactly 1 across four deliveries", got)
	}
	if got := testutil.ToFloat64(b.m.CollectRuns.WithLabelValues("referenced")) - referencedBefore; got != 4 {
		t.Errorf("referenced outcomes %v, want 4 (one per delivery)", got)
	}
}

func TestACollectTaskOfAnUnknownVersionIsNotRetried(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := collector.NewHandler(b.store, zerolog.Nop())
	for _, payload := range []string{`{"v":2,"steps":[{"id":1}]}`, `not json`} {
		err := h.ProcessTask(t.Context(), asynq.NewTask(tasks.TypeCollect, []byte(payload)))
		if !errors.Is(err, asynq.SkipRetry) {
			t.Errorf("payload %s: %v, want SkipRetry", payload, err)
		}
	}
}

// The sweeper pages through the steps table in bounded batches and finds
// every unreferenced step, however the ids are spread across pages.
func TestSweepFindsEveryUnreferencedStepAcrossPages(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var want []int64
	for i := range 25 {
		answered := 2
		if i%3 == 0 {
			answered = 1 // every third stays referenced
		}
		id := b.storeStep(t, "s"+string(rune('a'+i)), answered)
		if answered == 2 {
			want = append(want, id)
		}
	}
	reg := prometheus.NewRegistry()
	sm := metrics.NewSweeper(reg)
	sw := collector.NewSweeper(collector.SweeperConfig{BatchSize: 4}, b.store, nil, sm, zerolog.Nop())
	// every replica's stepcollect_uncollected_steps reads what the sweep recorded
	state := metrics.NewStateCollector(b.store.Gauges, 0)
	res, err := sw.Sweep(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if res.Examined != 25 || res.Unreferenced != len(want) || res.Collected != len(want) {
		t.Errorf("sweep %+v, want 25 examined and %d unreferenced and collected", res, len(want))
	}
	if got := gaugeValue(t, state, "stepcollect_uncollected_steps"); got != float64(len(want)) {
		t.Errorf("uncollected gauge %v, want %d", got, len(want))
	}
	for _, id := range want {
		if s, _, _ := b.exists(t, id); s != 0 {
			t.Errorf("step %d not collected", id)
		}
	}
	left := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps`)
	if left != 25-len(want) {
		t.Errorf("%d steps left, want the %d referenced ones", left, 25-len(want))
	}
	// a second sweep finds nothing and says so
	if res, err := sw.Sweep(t.Context()); err != nil || res.Unreferenced != 0 {
		t.Errorf("second sweep: %+v, %v", res, err)
	}
	if got := gaugeValue(t, state, "stepcollect_uncollected_steps"); got != 0 {
		t.Errorf("uncollected gauge %v after a clean sweep", got)
	}
}

// Raw commands whose step is gone (possible only where the foreign key was
// dropped, as NanoCMD's schema allows) are deleted by the sweep.
func TestSweepDeletesRawCommandsOfStepsThatAreGone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keep := b.storeStep(t, "keep", 0)
	if _, err := b.db.Exec(`ALTER TABLE step_commands DROP FOREIGN KEY step_commands_ibfk_1`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(`INSERT INTO step_commands (command_uuid, step_id, command, request_type) VALUES ('orphan', 999999, 'c', 'X')`); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	sw := collector.NewSweeper(collector.SweeperConfig{BatchSize: 1}, b.store, nil, metrics.NewSweeper(reg), zerolog.Nop())
	res, err := sw.Sweep(t.Context())
	if err != nil || res.OrphanedStepCommands != 1 {
		t.Fatalf("sweep %+v, %v; want 1 orphan deleted", res, err)
	}
	if _, _, raw := b.exists(t, keep); raw != 1 {
		t.Errorf("a live step's raw command was deleted")
	}
}

// gaugeValue reads one unlabelled gauge from a collector.
func gaugeValue(t *testing.T, c prometheus.Collector, name string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name && len(f.GetMetric()) == 1 {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("%s not exported", name)
	return 0
}
