package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// The scheduler's claims lock the steps that are due and nothing else. A
// claim whose time parameter went to the server with nine fractional digits
// was no range on the not_until (or timeout) index but a scan of all of it,
// and under FOR UPDATE SKIP LOCKED it held every step in the table until
// its transaction ended: in the sustained benchmark, every 10 s, each
// collector claim of the next 0.6 s skipped the steps it came for, and their
// collection waited seconds for asynq's retry.
//
// The scheduler's transaction is held open at its outbox insert (an
// uncommitted row already holds the event id it writes), and meanwhile
// another transaction claims the steps that are not due, as a collector
// does: every one of them must be free.
func TestSchedulerClaimsLockOnlyTheStepsThatAreDue(t *testing.T) {
	t.Parallel()
	// A time with nanoseconds, as time.Now() gives on Linux.
	now := time.Now().Truncate(time.Second).Add(123456789 * time.Nanosecond)
	cases := []struct {
		name  string
		event func(salt events.Salt, stepID int64) string
		run   func(ctx context.Context, b *bundle) (int, error)
		set   func(step *nanostorage.StepEnqueuingWithConfig)
	}{
		{
			name:  "due steps",
			event: func(salt events.Salt, id int64) string { return events.ID(salt, events.StepDue, id, "") },
			run:   func(ctx context.Context, b *bundle) (int, error) { return b.store.SendDueSteps(ctx, now) },
			set:   func(s *nanostorage.StepEnqueuingWithConfig) { s.NotUntil = now.Add(-time.Minute) },
		},
		{
			name: "timed-out steps",
			event: func(salt events.Salt, id int64) string {
				return events.ID(salt, events.StepTimedOut, id, testkit.EnrollmentID("sched-lock", 0))
			},
			run: func(ctx context.Context, b *bundle) (int, error) { return b.store.TimeOutSteps(ctx, now) },
			set: func(s *nanostorage.StepEnqueuingWithConfig) { s.Timeout = now.Add(-time.Minute) },
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// a pool the storage did not open, as an embedding program's:
			// times go to the server as the caller's time holds them, and
			// only the storage's own truncation keeps the claims a range
			db := testkit.NewDB(t, &testkit.DBOptions{LockWaitTimeout: 10, PlainPool: true})
			b := setup(t, &setupOpts{db: db, extra: []mysql.Option{mysql.WithIsolation(sql.LevelReadCommitted)}})
			ctx := t.Context()

			step := testkit.FanOut("sched-lock", 1, 1)
			tc.set(step)
			if err := b.store.StoreStep(ctx, step, now); err != nil {
				t.Fatal(err)
			}
			var dueID int64
			if err := b.db.QueryRow(`SELECT id FROM steps`).Scan(&dueID); err != nil {
				t.Fatal(err)
			}
			salt, err := mysql.EventIDSalt(ctx, b.db.DB)
			if err != nil {
				t.Fatal(err)
			}
			idle := insertIdleSteps(t, b.db.DB, 2000)
			// Statistics as a server keeps them on its own (it recalculates
			// them after 10% of a table changed): with them, and a literal
			// it cannot compare as a time, the optimizer scans the whole
			// not_until (or timeout) index in order rather than sort.
			if _, err := b.db.Exec(`ANALYZE TABLE steps`); err != nil {
				t.Fatal(err)
			}

			// Hold the event id the scheduler will write.
			blocker, err := b.db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer blocker.Rollback()
			var blockerConn int64
			if err := blocker.QueryRow(`SELECT CONNECTION_ID()`).Scan(&blockerConn); err != nil {
				t.Fatal(err)
			}
			if _, err := blocker.Exec(`INSERT INTO stepcollect_outbox (event_id, event_type, step_id, payload) VALUES (?, 'test.blocker', ?, '{}')`,
				tc.event(salt, dueID), dueID); err != nil {
				t.Fatal(err)
			}

			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := tc.run(ctx, b)
				done <- result{n, err}
			}()
			if !awaitOutboxInsert(t, b.db.DB, blockerConn, 15*time.Second) {
				blocker.Rollback()
				r := <-done
				t.Fatalf("the scheduler's transaction never waited at its outbox insert (it returned %d events, %v)", r.n, r.err)
			}

			// A collector's claim of the steps that are not due.
			claimer, err := b.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			rows, err := claimer.Query(`SELECT id FROM steps WHERE id IN (`+placeholders(len(idle))+`) ORDER BY id FOR UPDATE SKIP LOCKED`, anys(idle)...)
			if err != nil {
				t.Fatal(err)
			}
			claimed := 0
			for rows.Next() {
				claimed++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			rows.Close()
			claimer.Rollback()

			blocker.Rollback()
			r := <-done
			if r.err != nil || r.n != 1 {
				t.Fatalf("scheduler: %d events, %v; want 1 and no error", r.n, r.err)
			}
			if claimed != len(idle) {
				t.Fatalf("while the scheduler's transaction was open, a claim got %d of the %d steps that are not due: the scheduler held the others", claimed, len(idle))
			}
		})
	}
}

// insertIdleSteps adds n steps with neither not_until nor timeout, in one
// statement, and returns their ids.
func insertIdleSteps(t *testing.T, db *sql.DB, n int) []int64 {
	t.Helper()
	vals := make([]string, n)
	for i := range vals {
		vals[i] = fmt.Sprintf("('io.stepcollect.test.idle', 'idle-%d')", i)
	}
	if _, err := db.Exec(`INSERT INTO steps (workflow_name, instance_id) VALUES ` + strings.Join(vals, ",")); err != nil {
		t.Fatal(err)
	}
	ids := testkit.Column[int64](t, db, `SELECT id FROM steps WHERE workflow_name = 'io.stepcollect.test.idle' ORDER BY id`)
	if len(ids) != n {
		t.Fatalf("inserted %d idle steps, found %d", n, len(ids))
	}
	return ids
}

// awaitOutboxInsert returns true once a connection to this database (the
// test's own: the server is shared) other than the blocker's is running an
// INSERT into the outbox, which the blocker's uncommitted row makes wait,
// or false after within. Not the blocker's: its own INSERT is still listed
// as a running Query for a moment after the client has its OK, and a test
// that went on then (once, in a run beside CI) ran its claim before the
// scheduler's and saw the scheduler claim nothing.
func awaitOutboxInsert(t *testing.T, db *sql.DB, blocker int64, within time.Duration) bool {
	t.Helper()
	_, ok := testkit.Watch(time.Now().Add(within), func() bool {
		return testkit.Count(t, db, `SELECT COUNT(*) FROM information_schema.processlist
WHERE db = DATABASE() AND id <> ? AND command = 'Query' AND info LIKE 'INSERT INTO stepcollect_outbox%'`, blocker) > 0
	})
	return ok
}

func placeholders(n int) string { return strings.TrimSuffix(strings.Repeat("?,", n), ",") }

func anys(ids []int64) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}
