package mysql_test

import (
	"database/sql"
	"testing"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// A completion in two round trips whose second one fails after a statement
// in it ran (here the outbox insert meets its event id already taken, after
// the delete ran) is rolled back before its connection goes back to the
// pool. A connection handed back inside the transaction would commit the
// delete with the next caller's START TRANSACTION: the enrollment's rows
// gone and no event for them. A pool of one makes the next caller use that
// very connection.
func TestAFailedSecondRoundTripLeavesNothingHalfWritten(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, nil)
	db.SetMaxOpenConns(1)
	b := setup(t, &setupOpts{db: db, extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := b.stored(t, "halfway", 2, 1)
	var stepID int64
	if err := db.QueryRow(`SELECT id FROM steps`).Scan(&stepID); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`INSERT INTO stepcollect_outbox (event_id, event_type, step_id, payload) VALUES (?, 'test.taken', ?, '{}')`,
		testkit.EventID(t, db.DB, events.StepCompleted, stepID, step.IDs[0]), stepID); err != nil {
		t.Fatal(err)
	}

	if r, err := b.answer(ctx, step, 0, 0); err == nil {
		t.Fatalf("a completion whose event id was taken: %+v, no error", r)
	}
	if r, err := b.answer(ctx, step, 1, 0); err != nil || r == nil {
		t.Fatalf("the next completion on the same connection: %+v, %v", r, err)
	}
	if n := b.enrollmentRows(t, step.IDs[0]); n != 1 {
		t.Fatalf("the failed completion's enrollment holds %d rows, want its 1: its delete was committed without its event", n)
	}
	if n := testkit.OutboxRows(t, db.DB); n != 2 {
		t.Errorf("%d outbox rows, want 2 (the taken id and the second completion's event)", n)
	}
	if !mysql.TwoTrips(b.store) {
		t.Fatal("the completions took database/sql's transaction: OpenDB's pool should give two round trips")
	}
}

// A pool the storage did not open, without multiStatements, keeps
// database/sql's transaction; so does an isolation level set per
// transaction, which a START TRANSACTION by hand would not have.
func TestTwoRoundTripsOnlyWhereThePoolTakesThem(t *testing.T) {
	t.Parallel()
	plain := testkit.NewDB(t, &testkit.DBOptions{PlainPool: true})
	if b := setup(t, &setupOpts{db: plain}); mysql.TwoTrips(b.store) {
		t.Error("two round trips on a pool without multiStatements")
	}
	opened := testkit.NewDB(t, nil)
	if b := setup(t, &setupOpts{db: opened, extra: []mysql.Option{mysql.WithIsolation(sql.LevelReadCommitted)}}); mysql.TwoTrips(b.store) {
		t.Error("two round trips with WithIsolation: its level would be lost")
	}
	if b := setup(t, &setupOpts{db: opened}); !mysql.TwoTrips(b.store) {
		t.Error("no two round trips on OpenDB's pool")
	}
}
