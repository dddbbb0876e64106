package mysql_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// A database's event id salt is one value for every process that reads it
// and another for another database; a salt or a row gone missing is
// written again, once, whoever asks at the same moment; a database not
// migrated says so, naming what to do.
func TestEventIDSaltIsOnePerDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, b := testkit.NewDB(t, nil), testkit.NewDB(t, nil)
	saltA, err := mysql.EventIDSalt(ctx, a.DB)
	if err != nil {
		t.Fatal(err)
	}
	other, err := mysql.OpenDB(a.DSN) // another process's pool
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if again, err := mysql.EventIDSalt(ctx, other); err != nil || again != saltA {
		t.Errorf("read again by another pool: %d, %v; want %d", again, err, saltA)
	}
	if saltB, err := mysql.EventIDSalt(ctx, b.DB); err != nil || saltB == saltA {
		t.Errorf("another database's salt: %d, %v; want one other than %d", saltB, err, saltA)
	}

	// Gone, and asked for by 32 callers on two pools at once: every one
	// gets the one value that was written.
	for _, gone := range []string{`UPDATE stepcollect_deployment SET event_id_salt = NULL`, `DELETE FROM stepcollect_deployment`} {
		a.Exec(gone)
		got := make([]events.Salt, 32)
		errs := make([]error, 32)
		var wg sync.WaitGroup
		for i := range got {
			wg.Go(func() {
				pool := a.DB
				if i%2 == 1 {
					pool = other
				}
				got[i], errs[i] = mysql.EventIDSalt(ctx, pool)
			})
		}
		wg.Wait()
		var stored events.Salt
		if err := a.QueryRow(`SELECT event_id_salt FROM stepcollect_deployment WHERE id = 1`).Scan(&stored); err != nil {
			t.Fatalf("after %q: %v", gone, err)
		}
		for i := range got {
			if errs[i] != nil || got[i] != stored {
				t.Errorf("after %q, caller %d: %d, %v; want the stored %d", gone, i, got[i], errs[i], stored)
			}
		}
		if stored == saltA {
			t.Errorf("after %q: the old salt %d again", gone, stored)
		}
	}

	empty := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	if _, err := mysql.EventIDSalt(ctx, empty.DB); err == nil || !strings.Contains(err.Error(), "not migrated") || !strings.Contains(err.Error(), "-migrate=true") {
		t.Errorf("on a database not migrated: %v, want the schema's error naming -migrate=true", err)
	}
}

// Two databases number their steps alike: the first step of each is step
// 1. Their events about the same enrollment must not share an id, or a
// workflow engine deduplicating on event_id (as the contract tells it to)
// drops the second deployment's as already delivered. Each id is the
// one its own database's salt gives, so a lost COMMIT answer is still
// settled by looking for it.
func TestTwoDatabasesNeverWriteTheSameEventID(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	step := testkit.FanOut("salted", 20, 1)
	var (
		stepIDs [2]int64
		got     [2]map[string]events.Event
	)
	for i := range 2 {
		b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
		id, err := b.store.StoreStepID(ctx, step, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		stepIDs[i] = id
		startTogether(len(step.IDs), func(j int) {
			if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[j], testkit.CommandResult(step.Commands[0].CommandUUID)); err != nil {
				t.Errorf("database %d, %s: %v", i, step.IDs[j], err)
			}
		})
		got[i] = outboxEvents(t, b)
		for _, e := range step.IDs {
			if want := testkit.EventID(t, b.db.DB, events.StepCompleted, id, e); got[i][e].EventID != want {
				t.Errorf("database %d, %s: event id %q, want %q (its database's salt)", i, e, got[i][e].EventID, want)
			}
		}
	}
	if stepIDs[0] != stepIDs[1] {
		t.Fatalf("step ids %v: the test needs the same step id in both databases", stepIDs)
	}
	seen := map[string]string{}
	for i := range 2 {
		for _, e := range step.IDs {
			id := got[i][e].EventID
			if prev, dup := seen[id]; dup {
				t.Errorf("event id %s written by %s and by database %d's %s", id, prev, i, e)
			}
			seen[id] = e
		}
	}
	if len(seen) != 2*len(step.IDs) {
		t.Errorf("%d distinct event ids, want %d", len(seen), 2*len(step.IDs))
	}
}
