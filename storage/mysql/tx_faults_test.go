package mysql_test

import (
	"database/sql"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// Injected-fault tests for what a retry, a lost COMMIT answer or a skipped
// claim must never do: report what a rolled-back try produced, or settle
// an unknown COMMIT by guessing.

var injectedDeadlock = &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock (injected)"}

func countOutbox(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM stepcollect_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A deadlock at the end of a timeout transaction rolls it back; the retry
// must report each enrollment once, not once per try.
func TestARetriedTimeoutReportsEachEnrollmentOnce(t *testing.T) {
	t.Parallel()
	b, fc := setupFaulty(t)
	ctx := t.Context()
	step := testkit.FanOut("timeoutretry", 2, 1)
	step.Timeout = time.Now().Add(-time.Second)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	fc.arm(func(fc *faultConnector) {
		fc.failBefore, fc.failErr = "DELETE FROM steps WHERE id IN", injectedDeadlock
	})

	got, err := b.store.RetrieveTimedOutSteps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if fc.failed != 1 {
		t.Fatalf("the deadlock was injected %d times, want 1: the fault never happened", fc.failed)
	}
	var ids []string
	for _, r := range got {
		ids = append(ids, r.IDs...)
	}
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Errorf("timed-out enrollments %v, want each of the 2 once", ids)
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
}

// The same for the service's TimeOutSteps: its count matches the outbox,
// and the dispatcher's claim finds each event once.
func TestARetriedTimeoutWritesEachEventOnce(t *testing.T) {
	t.Parallel()
	b, fc := setupFaulty(t, stepmysql.WithOutbox())
	ctx := t.Context()
	step := testkit.FanOut("timeoutevents", 2, 1)
	step.Timeout = time.Now().Add(-time.Second)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	fc.arm(func(fc *faultConnector) {
		fc.failBefore, fc.failErr = "DELETE FROM steps WHERE id IN", injectedDeadlock
	})

	n, err := b.store.TimeOutSteps(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if fc.failed != 1 {
		t.Fatalf("the deadlock was injected %d times, want 1", fc.failed)
	}
	if rows := countOutbox(t, b.db.DB); n != 2 || rows != 2 {
		t.Errorf("reported %d events, the outbox holds %d; want 2 and 2", n, rows)
	}
	assertClaimsOnce(t, b, 2)
}

// An event insert that fails (for good) leaves nothing to deliver, and the
// step is sent, once, when the fault is gone.
func TestAFailedDueEventLeavesNothingToDeliver(t *testing.T) {
	t.Parallel()
	b, fc := setupFaulty(t, stepmysql.WithOutbox())
	ctx := t.Context()
	step := testkit.FanOut("duefail", 2, 1)
	step.NotUntil = time.Now().Add(-time.Second)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	fc.arm(func(fc *faultConnector) {
		fc.failBefore, fc.failErr = "INSERT INTO stepcollect_outbox", &mysql.MySQLError{Number: 1146, Message: "Table doesn't exist (injected)"}
	})

	n, err := b.store.SendDueSteps(ctx, time.Now())
	if err == nil || n != 0 {
		t.Fatalf("SendDueSteps with a failing insert: %d, %v; want 0 and the error", n, err)
	}
	assertClaimsOnce(t, b, 0)
	// and once the fault is gone the step is sent, once
	if n, err := b.store.SendDueSteps(ctx, time.Now()); err != nil || n != 1 {
		t.Fatalf("second SendDueSteps: %d, %v; want 1", n, err)
	}
	assertClaimsOnce(t, b, 1)
}

// A deadlock in a due-steps batch: the retry returns each step once.
func TestARetriedDueBatchReturnsEachStepOnce(t *testing.T) {
	t.Parallel()
	b, fc := setupFaulty(t)
	ctx := t.Context()
	for _, p := range []string{"dueretry-a", "dueretry-b"} {
		step := testkit.FanOut(p, 1, 1)
		step.NotUntil = time.Now().Add(-time.Second)
		if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	// the deadlock is reported by COMMIT, after the batch was built
	fc.arm(func(fc *faultConnector) { fc.refuseCommits, fc.refuseErr = 1, injectedDeadlock })
	got, err := b.store.RetrieveStepsToEnqueue(ctx, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if fc.refused != 1 || len(got) != 2 || got[0].InstanceID == got[1].InstanceID {
		t.Errorf("injected %d, got %d steps; want 1 fault and the 2 steps once each", fc.refused, len(got))
	}
}

// assertClaimsOnce claims what the dispatcher would and wants want
// distinct events, each a first attempt, then acknowledges them.
func assertClaimsOnce(t *testing.T, b *bundle, want int) {
	t.Helper()
	evs, err := b.store.ClaimDueEvents(t.Context(), 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	var refs []storage.OutboxRef
	for _, ev := range evs {
		if seen[ev.EventID] || ev.Attempts != 1 {
			t.Errorf("claimed %+v twice, or not as a first attempt", ev.OutboxRef)
		}
		seen[ev.EventID] = true
		refs = append(refs, ev.OutboxRef)
	}
	if len(evs) != want {
		t.Fatalf("the dispatcher would claim %d events, want %d", len(evs), want)
	}
	if err := b.store.AckEvents(t.Context(), refs); err != nil {
		t.Fatal(err)
	}
}

// The completing COMMIT never reached the server (answer lost), and a
// CheckOut cancelled the enrollment's steps before the retry: the rows are
// gone, but not by this result. No event was written, so the storage must
// not report a completed step (the webhook would answer completed_step
// with nothing in the outbox).
func TestALostCommitAnswerWithTheRowsCancelledMeanwhileIsNoCompletion(t *testing.T) {
	t.Parallel()
	onEveryPath(t, lostCommitAnswerWithTheRowsCancelledMeanwhile)
}

func lostCommitAnswerWithTheRowsCancelledMeanwhile(t *testing.T, multi completionPath) {
	b, fc := setupFaultyPath(t, multi, stepmysql.WithOutbox())
	ctx := t.Context()
	step := b.storedOn(t, multi, "lostcancel", 1, 1)
	fc.mu.Lock()
	fc.dropCommits = 1
	fc.betweenTries = func() {
		if _, err := b.db.Exec(`DELETE FROM id_commands WHERE enrollment_id = ?`, step.IDs[0]); err != nil {
			t.Error(err)
		}
	}
	fc.mu.Unlock()

	r, err := b.answer(ctx, step, 0, 0)
	if fc.dropped != 1 {
		t.Fatalf("dropped %d COMMITs, want 1: the fault never happened", fc.dropped)
	}
	if r != nil {
		t.Fatalf("reported a completed step %+v with no event written", r)
	}
	if !errors.Is(err, storage.ErrUnknownCommand) {
		t.Errorf("error %v, want the command unknown (it was cancelled; the result was not committed)", err)
	}
	if n := countOutbox(t, b.db.DB); n != 0 {
		t.Errorf("%d outbox rows", n)
	}
	fc.checkPath(t, multi)
}

// A server error reply to COMMIT (connection killed, shutdown, query
// killed) means "not committed": it is retried as such, and rows deleted
// meanwhile by a cancel are never taken as its success.
func TestAServerErrorReplyToCommitIsNotAnAmbiguousCommit(t *testing.T) {
	t.Parallel()
	onEveryPath(t, serverErrorReplyToCommit)
}

func serverErrorReplyToCommit(t *testing.T, multi completionPath) {
	for _, code := range []uint16{1927, 1053, 1317} {
		t.Run(strconv.Itoa(int(code)), func(t *testing.T) {
			// without the outbox: only the reply itself can tell
			b, fc := setupFaultyPath(t, multi)
			ctx := t.Context()
			step := b.storedOn(t, multi, "refused", 1, 1)
			fc.mu.Lock()
			fc.refuseCommits, fc.refuseErr = 1, &mysql.MySQLError{Number: code, Message: "injected"}
			fc.betweenTries = func() {
				if _, err := b.db.Exec(`DELETE FROM id_commands WHERE enrollment_id = ?`, step.IDs[0]); err != nil {
					t.Error(err)
				}
			}
			fc.mu.Unlock()
			r, err := b.answer(ctx, step, 0, 0)
			if fc.refused != 1 {
				t.Fatalf("refused %d COMMITs, want 1", fc.refused)
			}
			if r != nil || !errors.Is(err, storage.ErrUnknownCommand) {
				t.Errorf("after a refused COMMIT and a cancel: %+v, %v; want no step and the command unknown", r, err)
			}
			fc.checkPath(t, multi)
		})
	}
}

// Without the outbox nothing in the database can prove a lost COMMIT went
// through: the caller gets an error saying so, never a guess.
func TestALostCommitAnswerWithoutTheOutboxIsAnErrorNotAGuess(t *testing.T) {
	t.Parallel()
	onEveryPath(t, lostCommitAnswerWithoutTheOutbox)
}

func lostCommitAnswerWithoutTheOutbox(t *testing.T, multi completionPath) {
	b, fc := setupFaultyPath(t, multi)
	ctx := t.Context()
	step := b.storedOn(t, multi, "lostlib", 1, 1)
	fc.arm(func(fc *faultConnector) { fc.loseCommits = 1 })
	r, err := b.answer(ctx, step, 0, 0)
	if fc.lost != 1 {
		t.Fatalf("lost %d COMMIT answers, want 1", fc.lost)
	}
	if r != nil || !errors.Is(err, storage.ErrCommitUnknown) {
		t.Errorf("%+v, %v; want an error wrapping ErrCommitUnknown", r, err)
	}
	// The COMMIT did go through: the step is unreferenced, and it is
	// collected all the same rather than left to a sweep.
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps`); n != 0 {
		t.Errorf("%d steps left after a completion whose COMMIT answer was lost, want it collected", n)
	}
	fc.checkPath(t, multi)
}

// StoreStep's COMMIT went through but its answer was lost: the retry must
// find its own step and return its id, not meet its own rows as a 409.
func TestStoreStepAfterALostCommitAnswerReturnsItsStep(t *testing.T) {
	t.Parallel()
	b, fc := setupFaulty(t)
	ctx := t.Context()
	step := testkit.FanOut("storelost", 3, 2)
	fc.arm(func(fc *faultConnector) { fc.loseCommits = 1 })
	id, err := b.store.StoreStepID(ctx, step, time.Now())
	if fc.lost != 1 {
		t.Fatalf("lost %d COMMIT answers, want 1", fc.lost)
	}
	if err != nil || id == 0 {
		t.Fatalf("StoreStepID after a lost COMMIT answer: %d, %v; want the step's id", id, err)
	}
	var steps, rows int
	if err := b.db.QueryRow(`SELECT COUNT(*), (SELECT COUNT(*) FROM id_commands WHERE step_id = ?) FROM steps`, id).Scan(&steps, &rows); err != nil {
		t.Fatal(err)
	}
	if steps != 1 || rows != 6 {
		t.Errorf("%d steps and %d rows of step %d, want 1 and 6", steps, rows, id)
	}
}

// And when that COMMIT never reached the server, the retry stores the step
// once.
func TestStoreStepAfterADroppedCommitStoresItOnce(t *testing.T) {
	t.Parallel()
	b, fc := setupFaulty(t)
	ctx := t.Context()
	step := testkit.FanOut("storedropped", 3, 2)
	fc.arm(func(fc *faultConnector) { fc.dropCommits = 1 })
	id, err := b.store.StoreStepID(ctx, step, time.Now())
	if fc.dropped != 1 {
		t.Fatalf("dropped %d COMMITs, want 1", fc.dropped)
	}
	if err != nil || id == 0 {
		t.Fatalf("StoreStepID after a dropped COMMIT: %d, %v", id, err)
	}
	if c := countRows(t, b.db.DB); c.Steps != 1 || c.IDCommands != 6 {
		t.Errorf("rows %+v, want 1 step and 6 id_commands", c)
	}
}

// A step the collector's SKIP LOCKED claim passes over is held by someone
// (here: a transaction that locks the steps row as the scheduler's claims
// do, and lets it go without deleting it). It must still be collected
// once the lock is gone, not counted "claimed elsewhere" and left.
func TestASkippedClaimIsCheckedAgainUntilTheStepIsGone(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("skipped", 1, 1)
	stepID, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(`DELETE FROM id_commands WHERE step_id = ?`, stepID); err != nil {
		t.Fatal(err)
	}
	holder, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	if err := holder.QueryRow(`SELECT id FROM steps WHERE id = ? FOR UPDATE`, stepID).Scan(&held); err != nil {
		t.Fatal(err)
	}
	released := make(chan struct{})
	go func() {
		defer close(released)
		time.Sleep(80 * time.Millisecond) // held across the first claims, released well within the retries
		holder.Commit()
	}()
	res, err := b.store.Collect(ctx, []storage.ReleasedStep{{ID: stepID, ObservedAt: time.Now()}})
	<-released
	if err != nil || res[storage.CollectCollected] != 1 {
		t.Fatalf("collect across a held lock: %v, %v; want it collected", res, err)
	}
	if c := countRows(t, b.db.DB); c.Steps != 0 {
		t.Errorf("step left: %+v", c)
	}
}

// A lock held for longer than the retries: the step is reported as not
// collected (ErrClaimSkipped, for the caller to try again), never as done.
func TestAClaimSkippedForLongIsReportedNotDropped(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("heldlong", 1, 1)
	stepID, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(`DELETE FROM id_commands WHERE step_id = ?`, stepID); err != nil {
		t.Fatal(err)
	}
	holder, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	if err := holder.QueryRow(`SELECT id FROM steps WHERE id = ? FOR UPDATE`, stepID).Scan(&held); err != nil {
		t.Fatal(err)
	}
	res, err := b.store.Collect(ctx, []storage.ReleasedStep{{ID: stepID, ObservedAt: time.Now()}})
	if !errors.Is(err, storage.ErrClaimSkipped) || !strings.Contains(err.Error(), strconv.Itoa(int(stepID))) || res[storage.CollectClaimedElsewhere] != 1 {
		t.Fatalf("collect while the row stays locked: %v, %v; want ErrClaimSkipped naming step %d", res, err, stepID)
	}
	if err := holder.Rollback(); err != nil {
		t.Fatal(err)
	}
	if res, err := b.store.Collect(ctx, []storage.ReleasedStep{{ID: stepID}}); err != nil || res[storage.CollectCollected] != 1 {
		t.Fatalf("collect once the lock is gone: %v, %v", res, err)
	}
}

// A COMMIT whose answer was lost, after which the server cannot be reached
// to ask whether it went through: the caller is told the outcome is
// unknown (the webhook answers 503 saying so), never that nothing was
// written. Here it was written: the event shows it once the server is back.
func TestALostCommitAnswerWithTheServerGoneIsAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	onEveryPath(t, lostCommitAnswerWithTheServerGone)
}

func lostCommitAnswerWithTheServerGone(t *testing.T, multi completionPath) {
	b, fc := setupFaultyPath(t, multi, stepmysql.WithOutbox())
	ctx := t.Context()
	step := b.storedOn(t, multi, "lostdown", 1, 1)
	fc.arm(func(fc *faultConnector) {
		fc.loseCommits = 1
		fc.betweenTries = func() { fc.mu.Lock(); fc.down = true; fc.mu.Unlock() }
	})
	r, err := b.answer(ctx, step, 0, 0)
	fc.arm(func(fc *faultConnector) { fc.down = false })
	if fc.lost != 1 {
		t.Fatalf("lost %d COMMIT answers, want 1", fc.lost)
	}
	if r != nil || !errors.Is(err, storage.ErrCommitUnknown) {
		t.Errorf("%+v, %v; want an error wrapping ErrCommitUnknown", r, err)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE enrollment_id = ?`, step.IDs[0]); n != 1 {
		t.Errorf("%d events for %s, want the 1 its lost COMMIT wrote", n, step.IDs[0])
	}
}

// A step whose rows take more statements than one try's bound allows in
// all is stored all the same while each statement answers within it: the
// bound is on the time without progress. A step at the default limits
// (1,000,000 rows) was refused with a 503 blaming the server. A server
// that goes silent in the middle is still found within the bound.
func TestALargeStepIsBoundedByEachStatementNotTheWhole(t *testing.T) {
	t.Parallel()
	const bound = 800 * time.Millisecond
	b, fc := setupFaulty(t, stepmysql.WithAttemptTimeout(bound))
	ctx := t.Context()
	// 5 statements of 1000 rows, each 300 ms slow: 1.5 s in all
	fc.arm(func(fc *faultConnector) { fc.slowBefore, fc.slowBy = "INSERT INTO id_commands", 300*time.Millisecond })
	step := testkit.FanOut("slowbig", 2500, 2)
	id, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatalf("a 5000-row step, each statement within the bound: %v", err)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE step_id = ?`, id); n != 5000 {
		t.Errorf("%d rows of step %d, want 5000", n, id)
	}

	fc.arm(func(fc *faultConnector) { fc.slowBefore, fc.stallBefore = "", "INSERT INTO id_commands" })
	start := time.Now()
	id, err = b.store.StoreStepID(ctx, testkit.FanOut("silentbig", 2500, 2), time.Now())
	if err != nil || fc.stalled != 1 {
		t.Fatalf("a step whose first rows met a silent server: %d, %v (%d held); want it stored on the next try", id, err, fc.stalled)
	}
	if took := time.Since(start); took > 10*bound {
		t.Errorf("stored %v after the server went silent, want about one bound (%v) later", took, bound)
	}
}
