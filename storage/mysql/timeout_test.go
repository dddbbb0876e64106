package mysql_test

import (
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// A step fanned out to more enrollments than one timeout transaction takes
// (1000) times out over several short transactions: every enrollment is
// reported once, and the step goes with the last of them.
func TestALargeStepTimesOutInBoundedTransactions(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("bigtimeout", 2500, 2)
	step.Timeout = time.Now().Add(-time.Second)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	got, err := b.store.RetrieveTimedOutSteps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, r := range got {
		if len(r.IDs) != 1 || len(r.Commands) != 2 {
			t.Fatalf("result %+v: want one enrollment with its 2 commands", r)
		}
		seen[r.IDs[0]]++
	}
	if len(seen) != 2500 || len(got) != 2500 {
		t.Errorf("%d results for %d enrollments, want 2500 for 2500", len(got), len(seen))
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
}

// A step delayed by NotUntil and then sent is an ordinary step: it must
// still time out (NanoCMD's process_id marker kept it from ever doing so).
func TestNotUntilStepStillTimesOutAfterItWasSent(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("nu-timeout", 2, 1)
	step.NotUntil = time.Now().Add(-time.Minute)
	step.Timeout = time.Now().Add(2 * time.Second)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	due, err := b.store.RetrieveStepsToEnqueue(ctx, time.Now())
	if err != nil || len(due) != 1 || len(due[0].IDs) != 2 || len(due[0].Commands) != 1 {
		t.Fatalf("due steps: %+v, %v", due, err)
	}
	if again, err := b.store.RetrieveStepsToEnqueue(ctx, time.Now()); err != nil || len(again) != 0 {
		t.Fatalf("sent twice: %+v, %v", again, err)
	}
	if _, err := b.db.Exec(`UPDATE steps SET timeout = ?`, time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	timedOut, err := b.store.RetrieveTimedOutSteps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(timedOut) != 2 {
		t.Fatalf("timed out: %d results, want one per enrollment (2)", len(timedOut))
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
}
