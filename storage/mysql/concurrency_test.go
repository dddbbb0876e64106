package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// requireRealConcurrency fails a concurrency test whose pool could not have
// run its transactions in parallel: a pool of one passes every race test.
func requireRealConcurrency(t *testing.T, b *bundle) {
	t.Helper()
	st := b.db.Stats()
	if st.MaxOpenConnections < 32 {
		t.Fatalf("pool allows %d connections; a concurrency test needs 32+", st.MaxOpenConnections)
	}
	if st.OpenConnections < 2 {
		t.Fatalf("only %d connection was ever open: the transactions did not overlap", st.OpenConnections)
	}
}

func TestFanOutOf300AllReportingAtOnceCommitsEveryResultAndLeavesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	const n = 300
	step := b.stored(t, "fanout", n, 1)

	results := make([]*nanostorage.StepResult, n)
	errs := make([]error, n)
	startTogether(n, func(i int) {
		results[i], errs[i] = b.answer(ctx, step, i, 0)
	})

	for i := range n {
		if errs[i] != nil {
			t.Errorf("enrollment %s: %v", step.IDs[i], errs[i])
			continue
		}
		r := results[i]
		if r == nil {
			t.Errorf("enrollment %s: step not reported complete", step.IDs[i])
			continue
		}
		if len(r.IDs) != 1 || r.IDs[0] != step.IDs[i] || r.WorkflowName != step.WorkflowName ||
			r.InstanceID != step.InstanceID || r.Name != step.Name || string(r.Context) != string(step.Context) {
			t.Errorf("enrollment %s: wrong step result %+v", step.IDs[i], r.StepContext)
		}
		if len(r.Commands) != 1 || string(r.Commands[0].ResultReport) != string(testkit.CommandResult(step.Commands[0].CommandUUID).ResultReport) ||
			r.Commands[0].RequestType != "DeviceInformation" {
			t.Errorf("enrollment %s: wrong commands %+v", step.IDs[i], r.Commands)
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left after the fan-out: %+v", c)
	}
	_, collected := b.obs.snapshot()
	if collected[storage.CollectCollected] != 1 {
		t.Errorf("steps collected: %d, want exactly 1 (%v)", collected[storage.CollectCollected], collected)
	}
	requireRealConcurrency(t, b)
}

// Inline collection (no Collector) checks the releases of results
// committed at the same time together: a fan-out is not checked once per
// result (each check reads past every entry the results before it
// deleted: quadratic in the fan-out), and a burst of one-step releases is
// claimed in shared transactions, not one each. Every step is still
// collected before its last result returns.
func TestConcurrentReleasesAreCheckedAndCollectedInGroups(t *testing.T) {
	t.Parallel()
	const n = 300
	t.Run("one step to all", func(t *testing.T) {
		b := setup(t, nil)
		step := b.stored(t, "grouped", n, 1)
		var failed atomicCount
		startTogether(n, func(i int) {
			if r, err := b.answer(t.Context(), step, i, 0); err != nil || r == nil {
				failed.add()
			}
		})
		if failed.n() > 0 {
			t.Fatalf("%d of %d results failed or did not complete", failed.n(), n)
		}
		if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
			t.Errorf("rows left once every result returned: %+v", c)
		}
		if runs := b.obs.collectionRuns(); runs > n/3 {
			t.Errorf("%d collection runs (a check each) for %d results released together; want them grouped (at most %d)", runs, n, n/3)
		}
		requireRealConcurrency(t, b)
	})
	t.Run("a step each", func(t *testing.T) {
		b := setup(t, nil)
		steps := make([]*nanostorage.StepEnqueuingWithConfig, n)
		for i := range steps {
			steps[i] = b.stored(t, fmt.Sprintf("each%03d", i), 1, 1)
		}
		var failed atomicCount
		startTogether(n, func(i int) {
			if r, err := b.answer(t.Context(), steps[i], 0, 0); err != nil || r == nil {
				failed.add()
			}
		})
		if failed.n() > 0 {
			t.Fatalf("%d of %d results failed or did not complete", failed.n(), n)
		}
		if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
			t.Errorf("rows left once every result returned: %+v", c)
		}
		_, collected := b.obs.snapshot()
		if collected[storage.CollectCollected] != n {
			t.Errorf("collected %d steps, want %d (%v)", collected[storage.CollectCollected], n, collected)
		}
		if runs := b.obs.collectionRuns(); runs > n/3 {
			t.Errorf("%d collection runs (a check and a claim transaction each) for %d steps released together; want them grouped (at most %d)", runs, n, n/3)
		}
		requireRealConcurrency(t, b)
	})
}

type atomicCount struct {
	mu sync.Mutex
	v  int
}

func (c *atomicCount) add()   { c.mu.Lock(); c.v++; c.mu.Unlock() }
func (c *atomicCount) n() int { c.mu.Lock(); defer c.mu.Unlock(); return c.v }

func TestNotUntilStepCompletesWithItsRawCommandsStillPresent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("notuntil", 2, 3)
	step.NotUntil = time.Now().Add(time.Hour)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	if c := countRows(t, b.db.DB); c.StepCommands != 3 {
		t.Fatalf("raw commands stored: %d, want 3", c.StepCommands)
	}
	for _, id := range step.IDs {
		var done *nanostorage.StepResult
		for _, c := range step.Commands {
			r, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(c.CommandUUID))
			if err != nil {
				t.Fatalf("enrollment %s, command %s: %v", id, c.CommandUUID, err)
			}
			if r != nil {
				done = r
			}
		}
		if done == nil || len(done.Commands) != 3 {
			t.Fatalf("enrollment %s: completed step %+v, want 3 commands", id, done)
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
}

// MDM reports one command at a time, so this drives a state the protocol
// does not produce: it proves the storage decides completion from rows it
// holds rather than relying on its caller to serialise.
func TestOneEnrollmentAnsweringItsFourCommandsConcurrentlyCompletesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	const enrollments, cmds = 40, 4
	var steps []*nanostorage.StepEnqueuingWithConfig
	for e := range enrollments {
		st := testkit.FanOut(fmt.Sprintf("four%02d", e), 1, cmds)
		if err := b.store.StoreStep(ctx, st, time.Now()); err != nil {
			t.Fatal(err)
		}
		steps = append(steps, st)
	}
	var mu sync.Mutex
	completions := map[string][]*nanostorage.StepResult{}
	var errs []error
	startTogether(enrollments*cmds, func(i int) {
		st := steps[i/cmds]
		r, err := b.answer(ctx, st, 0, i%cmds)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
		}
		if r != nil {
			completions[st.IDs[0]] = append(completions[st.IDs[0]], r)
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
	for _, st := range steps {
		got := completions[st.IDs[0]]
		if len(got) != 1 {
			t.Errorf("enrollment %s: completed %d times, want once", st.IDs[0], len(got))
			continue
		}
		seen := map[string]bool{}
		for _, c := range got[0].Commands {
			if string(c.ResultReport) != string(testkit.CommandResult(c.CommandUUID).ResultReport) || !c.Completed {
				t.Errorf("enrollment %s: command %s has result %q", st.IDs[0], c.CommandUUID, c.ResultReport)
			}
			seen[c.CommandUUID] = true
		}
		if len(seen) != cmds {
			t.Errorf("enrollment %s: completed step holds %d distinct commands, want %d", st.IDs[0], len(seen), cmds)
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
	requireRealConcurrency(t, b)
}

func TestTwentyCancelsRacingFiftyCompletionsOfASharedStep(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	const cancels, completes = 20, 50
	step := b.stored(t, "race", cancels+completes, 1)
	// unrelated steps, some sharing enrollments, that must survive untouched
	for i := range 40 {
		other := testkit.FanOut(fmt.Sprintf("bystander%02d", i), 3, 1)
		other.IDs[0] = step.IDs[i] // same enrollments, other workflow
		if err := b.store.StoreStep(ctx, other, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	before := countRows(t, b.db.DB)

	var mu sync.Mutex
	var errs []error
	done := 0
	startTogether(cancels+completes, func(i int) {
		var err error
		var r *nanostorage.StepResult
		if i < cancels {
			err = b.store.CancelSteps(ctx, step.IDs[i], step.WorkflowName)
		} else {
			r, err = b.answer(ctx, step, i, 0)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", step.IDs[i], err))
		}
		if r != nil {
			done++
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
	if done != completes {
		t.Errorf("completed %d, want %d", done, completes)
	}
	after := countRows(t, b.db.DB)
	want := testkit.StepRows{Steps: before.Steps - 1, IDCommands: before.IDCommands - cancels - completes}
	if after != want {
		t.Errorf("rows after: %+v, want %+v (the shared step gone, every bystander intact)", after, want)
	}
	requireRealConcurrency(t, b)
}

// The timeout sweep (three workers at once) and the enrollments' results
// race for the same rows: each enrollment must end up exactly once, either
// completed or timed out, with nothing left behind and no error but "this
// command is gone" for a result that lost.
func TestTimeoutSweepRacingCompletionsReportsEachEnrollmentOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	const n, sweepers = 200, 3
	step := testkit.FanOut("timeout", n, 2)
	step.Timeout = time.Now().Add(-time.Second)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	// every enrollment answered its first command already
	for _, id := range step.IDs {
		if r, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(step.Commands[0].CommandUUID)); err != nil || r != nil {
			t.Fatalf("first answer of %s: %v, %v", id, r, err)
		}
	}

	var mu sync.Mutex
	outcome := map[string][]string{}
	var errs []error
	startTogether(n+sweepers, func(i int) {
		if i < sweepers {
			res, err := b.store.RetrieveTimedOutSteps(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			for _, r := range res {
				if len(r.Commands) != 2 {
					errs = append(errs, fmt.Errorf("timed-out %s: %d commands, want 2", r.IDs[0], len(r.Commands)))
				}
				for _, c := range r.Commands {
					if c.Completed != (c.CommandUUID == step.Commands[0].CommandUUID) {
						errs = append(errs, fmt.Errorf("timed-out %s: command %s completed=%v", r.IDs[0], c.CommandUUID, c.Completed))
					}
				}
				outcome[r.IDs[0]] = append(outcome[r.IDs[0]], "timed out")
			}
			return
		}
		id := step.IDs[i-sweepers]
		r, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(step.Commands[1].CommandUUID))
		mu.Lock()
		defer mu.Unlock()
		switch {
		case errors.Is(err, storage.ErrUnknownCommand):
			// the sweep took it first
		case err != nil:
			errs = append(errs, err)
		case r != nil:
			outcome[id] = append(outcome[id], "completed")
		default:
			errs = append(errs, fmt.Errorf("%s: last command answered but step not complete", id))
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
	var timedOut, completed int
	for _, id := range step.IDs {
		switch o := outcome[id]; {
		case len(o) != 1:
			t.Errorf("enrollment %s: outcomes %v, want exactly one", id, o)
		case o[0] == "completed":
			completed++
		default:
			timedOut++
		}
	}
	t.Logf("%d completed, %d timed out", completed, timedOut)
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
	requireRealConcurrency(t, b)
}

// failingSink simulates a process that committed its result and then
// died (or lost Redis) before collecting.
type failingSink struct {
	mu    sync.Mutex
	steps []storage.ReleasedStep
}

func (f *failingSink) StepsReleased(_ context.Context, steps []storage.ReleasedStep) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.steps = append(f.steps, steps...)
	return errors.New("queue unavailable")
}

func TestCrashBetweenCommitAndCollectionLeavesAStepALaterCollectReclaims(t *testing.T) {
	t.Parallel()
	sink := &failingSink{}
	b := setup(t, &setupOpts{sink: sink})
	ctx := t.Context()
	step := testkit.FanOut("crash", 50, 1)
	step.NotUntil = time.Now().Add(time.Hour) // raw commands must go too
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	errs := make([]error, len(step.IDs))
	startTogether(len(step.IDs), func(i int) {
		var r *nanostorage.StepResult
		r, errs[i] = b.answer(ctx, step, i, 0)
		if errs[i] == nil && r == nil {
			errs[i] = errors.New("not completed")
		}
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("%s: a failed hand-off must not fail the result: %v", step.IDs[i], err)
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{Steps: 1, StepCommands: 1}) {
		t.Fatalf("after the failed hand-off: %+v, want the unreferenced step and its raw command", c)
	}
	if len(sink.steps) == 0 {
		t.Fatal("the sink was never offered the step")
	}

	res, err := b.store.Collect(ctx, sink.steps)
	if err != nil {
		t.Fatal(err)
	}
	if res[storage.CollectCollected] != 1 {
		t.Errorf("collect outcomes %v, want 1 collected", res)
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left after the later collection: %+v", c)
	}
	// collecting again is harmless
	res, err = b.store.Collect(ctx, sink.steps)
	if err != nil || res[storage.CollectGone] != 1 || res[storage.CollectCollected] != 0 {
		t.Errorf("second collection: %v, %v; want the one step gone", res, err)
	}
}

// Holding every row the reporting enrollment does not own, and the shared
// steps row itself, must not delay its completion at all.
func TestCompletionLocksOnlyTheReportingEnrollmentsRows(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("ownrows", 3, 2)
	stepID, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	blocker, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback()
	if _, err := blocker.Exec(`SELECT id FROM steps WHERE id = ? FOR UPDATE`, stepID); err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(`SELECT * FROM id_commands WHERE enrollment_id IN (?, ?) FOR UPDATE`, step.IDs[1], step.IDs[2]); err != nil {
		t.Fatal(err)
	}

	testkit.Complete(t, b.store, step, step.IDs[0])
	if retries, _ := b.obs.snapshot(); len(retries) != 0 {
		t.Errorf("completion waited on rows it does not own: retries %v", retries)
	}
	left := b.enrollmentRows(t, step.IDs[0])
	if left != 0 {
		t.Errorf("enrollment rows left: %d", left)
	}
}

func TestLockWaitTimeoutIsRetriedNotSurfaced(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{LockWaitTimeout: 1})
	b := setup(t, &setupOpts{db: db})
	ctx := t.Context()
	step := b.stored(t, "lockwait", 1, 1)
	blocker, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := blocker.Exec(`SELECT * FROM id_commands WHERE enrollment_id = ? FOR UPDATE`, step.IDs[0]); err != nil {
		t.Fatal(err)
	}
	// Release the enrollment's row once the result has hit 1205 at least once.
	go func() {
		// past the bound the result has run out of tries and failed the
		// test; the rollback then only cleans up
		testkit.Watch(time.Now().Add(30*time.Second), func() bool {
			r, _ := b.obs.snapshot()
			return r["store command result/lock_wait_timeout"] > 0
		})
		blocker.Rollback()
	}()
	r, err := b.answer(ctx, step, 0, 0)
	if err != nil || r == nil {
		t.Fatalf("result after a lock wait timeout: %v, %v", r, err)
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
}

// At most WithMaxActiveResults results are in a transaction at once,
// whatever the pool allows: 200 enrollments answering one step at once on
// a pool of 48, bounded to 4, have at most 4 in a transaction, and every
// one completes its step exactly once. Bounded only by the pool's 48, the
// same load has more than 4 at once: the bound is what holds them.
func TestResultsInATransactionAtOnceStayWithinTheBound(t *testing.T) {
	t.Parallel()
	const n = 200
	for _, bound := range []int{4, testkit.PoolSize} {
		t.Run(fmt.Sprint("bound ", bound), func(t *testing.T) {
			t.Parallel()
			_, store := testkit.NewStorage(t, stepmysql.WithMaxActiveResults(bound))
			step := testkit.FanOut(fmt.Sprint("bound", bound), n, 1)
			if err := store.StoreStep(t.Context(), step, time.Now()); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			completed := 0
			release := make(chan struct{})
			for _, id := range step.IDs {
				wg.Go(func() {
					<-release
					res, err := store.StoreCommandResponseAndRetrieveCompletedStep(t.Context(), id, testkit.CommandResult(step.Commands[0].CommandUUID))
					if err != nil {
						t.Errorf("%s: %v", id, err)
						return
					}
					if res != nil {
						mu.Lock()
						completed++
						mu.Unlock()
					}
				})
			}
			close(release)
			wg.Wait()
			if completed != n {
				t.Errorf("%d of %d enrollments completed their step", completed, n)
			}
			peak := stepmysql.ActiveResultsPeak(store)
			switch {
			case bound < testkit.PoolSize && peak > int64(bound):
				t.Errorf("%d results were in a transaction at once, bound %d", peak, bound)
			case bound == testkit.PoolSize && peak <= 4:
				t.Errorf("at most %d results were in a transaction at once with the pool's %d: the load does not test a bound of 4", peak, bound)
			}
			t.Logf("bound %d: at most %d at once", bound, peak)
		})
	}
}
