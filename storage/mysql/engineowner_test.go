package mysql_test

import (
	"errors"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// On a database cmd/nanocmd marked, stepcollect's scheduler claims
// nothing: the due and timed-out steps stay for NanoCMD's engine worker,
// whose own claims (RetrieveStepsToEnqueue, RetrieveTimedOutSteps) still
// get them. A second storage (another process: cmd/worker) sees the mark.
func TestTheSchedulerClaimsNothingOnADatabaseNanoCMDsEngineOwns(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	due := testkit.FanOut("due", 2, 1)
	due.NotUntil = time.Now().Add(-time.Second)
	tmo := testkit.FanOut("tmo", 2, 1)
	tmo.Timeout = time.Now().Add(-time.Second)
	for _, st := range []*nanostorage.StepEnqueuingWithConfig{due, tmo} {
		if err := b.store.StoreStep(ctx, st, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.store.MarkScheduleOwnedByEngine(ctx); err != nil {
		t.Fatal(err)
	}
	worker := setup(t, &setupOpts{db: b.db, extra: []mysql.Option{mysql.WithOutbox()}})
	if n, err := worker.store.SendDueSteps(ctx, time.Now()); n != 0 || !errors.Is(err, storage.ErrScheduleOwnedByEngine) {
		t.Errorf("SendDueSteps: %d, %v; want 0, ErrScheduleOwnedByEngine", n, err)
	}
	if n, err := worker.store.TimeOutSteps(ctx, time.Now()); n != 0 || !errors.Is(err, storage.ErrScheduleOwnedByEngine) {
		t.Errorf("TimeOutSteps: %d, %v; want 0, ErrScheduleOwnedByEngine", n, err)
	}
	if n := testkit.OutboxRows(t, b.db.DB); n != 0 {
		t.Errorf("%d events written for NanoCMD's steps", n)
	}
	enq, err := b.store.RetrieveStepsToEnqueue(ctx, time.Now())
	if err != nil || len(enq) != 1 {
		t.Errorf("NanoCMD's worker got %d due steps, %v; want 1", len(enq), err)
	}
	timedOut, err := b.store.RetrieveTimedOutSteps(ctx)
	if err != nil || len(timedOut) != 2 {
		t.Errorf("NanoCMD's worker got %d timed-out results, %v; want 2", len(timedOut), err)
	}
}
