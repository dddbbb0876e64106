package mysql_test

import (
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// Two replicas of the storage on one database take a warm fan-out's
// results, every enrollment answering its three commands at once and each
// result going to either replica: each replica's hints see only some of an
// enrollment's results, and what one predicts the other may have changed.
// Each enrollment completes exactly once, with every result and one
// event, on READ COMMITTED (OpenDB's sessions) and on REPEATABLE READ (a
// pool the storage did not open, with multiStatements on, and once more
// with the found-rows flag, which changes what an UPDATE says it
// changed), and some of the completions, and of the results that left a
// command outstanding, did go in one round trip.
func TestPredictedCompletionsOnTwoReplicasCompleteEachEnrollmentOnce(t *testing.T) {
	t.Parallel()
	for _, pool := range []string{"READ-COMMITTED", "REPEATABLE-READ", "REPEATABLE-READ/clientFoundRows"} {
		level, foundRows := strings.CutSuffix(pool, "/clientFoundRows")
		t.Run(pool, func(t *testing.T) {
			t.Parallel()
			db := testkit.NewDB(t, nil)
			if level == "REPEATABLE-READ" {
				db = repeatableReadPool(t, db, foundRows)
			}
			if got := sessionIsolation(t, db.DB); got != level {
				t.Fatalf("sessions at %s, want %s", got, level)
			}
			opts := &setupOpts{db: db, extra: []stepmysql.Option{stepmysql.WithOutbox()}}
			a, b := setup(t, opts), setup(t, opts)
			if !stepmysql.TwoTrips(a.store) {
				t.Fatal("no multi-statement completions on this pool: nothing to predict")
			}
			replicasRace(t, a, b)
		})
	}
}

func replicasRace(t *testing.T, a, b *bundle) {
	ctx := t.Context()
	const n, cmds = 150, 3
	step := a.storedOn(t, completionPaths[2], "race", n, cmds)
	// b warms on one enrollment of its own, as a replica would
	for c := range cmds {
		if _, err := b.answer(ctx, step, n-1, c); err != nil {
			t.Fatal(err)
		}
	}
	var mu sync.Mutex
	completions := map[string][]*nanostorage.StepResult{}
	var errs []error
	startTogether((n-1)*cmds, func(i int) {
		replica := a
		if rand.N(2) == 1 {
			replica = b
		}
		r, err := replica.answer(ctx, step, i/cmds, i%cmds)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
		}
		if r != nil {
			completions[r.IDs[0]] = append(completions[r.IDs[0]], r)
		}
	})
	for _, err := range errs {
		t.Error(err)
	}
	for _, id := range step.IDs[:n-1] {
		got := completions[id]
		if len(got) != 1 {
			t.Errorf("enrollment %s: completed %d times, want once", id, len(got))
			continue
		}
		checkAllResults(t, id, got[0].Commands, cmds)
	}
	events := outboxEvents(t, a)
	if len(events) != n {
		t.Errorf("%d enrollments have an event, want %d", len(events), n)
	}
	for id, ev := range events {
		if len(ev.Step.Commands) != cmds {
			t.Errorf("enrollment %s: event with %d commands, want %d", id, len(ev.Step.Commands), cmds)
		}
	}
	if c := countRows(t, a.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
	ca, ra := stepmysql.OneTrips(a.store)
	cb, rb := stepmysql.OneTrips(b.store)
	t.Logf("one round trip: %d and %d committed, %d and %d refused by their guard", ca, cb, ra, rb)
	if ca+cb == 0 {
		t.Error("no completion went in one round trip: the race never took the predicted path")
	}
	sa, rsa := stepmysql.OneTripStores(a.store)
	sb, rsb := stepmysql.OneTripStores(b.store)
	t.Logf("results leaving a command outstanding, in one round trip: %d and %d committed, %d and %d refused", sa, sb, rsa, rsb)
	if sa+sb == 0 {
		t.Error("no result that left a command outstanding went in one round trip")
	}
	requireRealConcurrency(t, a)
}

// A prediction another replica made stale is refused by its guard and
// leaves nothing of itself: the completion then runs as if there had been
// no prediction. Here the other replica stored the first command's result
// again with other bytes (the event must carry those), or cancelled the
// enrollment (no event at all, and the command unknown).
func TestAStalePredictionIsRefusedAndLeavesNothing(t *testing.T) {
	t.Parallel()
	onBothOneTripForms(t, aStalePredictionIsRefused)
}

// onBothOneTripForms runs test with the one-round-trip completion sent as
// the multi-statement query and as the routine's CALL (procedure.go),
// and checks that each form did run.
func onBothOneTripForms(t *testing.T, test func(t *testing.T, call bool) *bundle) {
	for _, call := range []bool{false, true} {
		t.Run(map[bool]string{false: "query", true: "call"}[call], func(t *testing.T) {
			t.Parallel()
			a := test(t, call)
			if n := stepmysql.Calls(a.store); call != (n > 0) {
				t.Errorf("%d completions sent as a CALL; want some only with the routine on (%v)", n, call)
			}
		})
	}
}

func aStalePredictionIsRefused(t *testing.T, call bool) *bundle {
	a, b, step := staleReplicas(t, call, "stale", 2, 2)
	ctx := t.Context()
	warmCommitted, _ := stepmysql.OneTrips(a.store) // the warm-up's

	// enrollment 0: a stores its first result, b stores it again, changed
	if _, err := a.answer(ctx, step, 0, 0); err != nil {
		t.Fatal(err)
	}
	changed := testkit.CommandResult(step.Commands[0].CommandUUID)
	changed.ResultReport = append([]byte("<!-- again -->"), changed.ResultReport...)
	if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], changed); err != nil {
		t.Fatal(err)
	}
	r, err := a.answer(ctx, step, 0, 1)
	if err != nil || r == nil {
		t.Fatalf("completing after a changed result: %+v, %v", r, err)
	}
	for _, c := range r.Commands {
		if c.CommandUUID == changed.CommandUUID && string(c.ResultReport) != string(changed.ResultReport) {
			t.Errorf("the completed step carries %q for %s, want the result stored last, %q", c.ResultReport, c.CommandUUID, changed.ResultReport)
		}
	}
	if committed, refused := stepmysql.OneTrips(a.store); refused != 1 || committed != warmCommitted {
		t.Errorf("%d committed in one round trip after the warm-up's %d, %d refused; want the stale one refused", committed-warmCommitted, warmCommitted, refused)
	}

	// enrollment 1: a stores its first result, b cancels the enrollment
	if _, err := a.answer(ctx, step, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CancelSteps(ctx, step.IDs[1], ""); err != nil {
		t.Fatal(err)
	}
	r, err = a.answer(ctx, step, 1, 1)
	if r != nil || !errors.Is(err, storage.ErrUnknownCommand) {
		t.Fatalf("completing a cancelled enrollment: %+v, %v; want no step and the command unknown", r, err)
	}
	if _, refused := stepmysql.OneTrips(a.store); refused != 2 {
		t.Errorf("%d predictions refused, want 2", refused)
	}
	if n := a.enrollmentRows(t, step.IDs[1]); n != 0 {
		t.Errorf("the cancelled enrollment holds %d rows", n)
	}
	events := outboxEvents(t, a)
	if _, ok := events[step.IDs[1]]; ok || len(events) != 1 {
		t.Errorf("events for %v, want enrollment %s's alone (and the warm-up's, taken out)", keys(events), step.IDs[0])
	}
	return a
}

// The completion of a one-command step predicts the enrollment's only row
// outstanding (stepcollect_complete_single where called): a row another
// replica took away (a cancel, or the same result it completed first)
// refuses it, and neither commits an event.
func TestAStaleSinglePredictionIsRefused(t *testing.T) {
	t.Parallel()
	onBothOneTripForms(t, aStaleSinglePredictionIsRefused)
}

func aStaleSinglePredictionIsRefused(t *testing.T, call bool) *bundle {
	a, b, step := staleReplicas(t, call, "stalesingle", 3, 1)
	ctx := t.Context()
	_, refused0 := stepmysql.OneTrips(a.store)
	single0 := stepmysql.SingleCalls(a.store) // the warm-up's, predicted too: a stored the step

	// enrollment 0: b cancels it
	if err := b.store.CancelSteps(ctx, step.IDs[0], ""); err != nil {
		t.Fatal(err)
	}
	if r, err := a.answer(ctx, step, 0, 0); r != nil || !errors.Is(err, storage.ErrUnknownCommand) {
		t.Fatalf("completing a cancelled enrollment: %+v, %v; want no step and the command unknown", r, err)
	}
	// enrollment 1: b completes it, and a gets the same result again
	if r, err := b.answer(ctx, step, 1, 0); err != nil || r == nil {
		t.Fatalf("completing %s on the other replica: %+v, %v", step.IDs[1], r, err)
	}
	if r, err := a.answer(ctx, step, 1, 0); r != nil || !errors.Is(err, storage.ErrUnknownCommand) {
		t.Fatalf("the same result again after its step completed: %+v, %v; want no step and the command unknown", r, err)
	}
	// enrollment 2: as predicted
	if r, err := a.answer(ctx, step, 2, 0); err != nil || r == nil {
		t.Fatalf("completing %s: %+v, %v", step.IDs[2], r, err)
	}
	if _, refused := stepmysql.OneTrips(a.store); refused-refused0 != 2 {
		t.Errorf("%d predictions refused, want 2", refused-refused0)
	}
	if single := stepmysql.SingleCalls(a.store) - single0; call && single != 1 {
		t.Errorf("%d completions committed as stepcollect_complete_single, want enrollment %s's", single, step.IDs[2])
	}
	events := outboxEvents(t, a)
	if _, ok := events[step.IDs[0]]; ok || len(events) != 2 {
		t.Errorf("events for %v, want enrollments %s's and %s's alone", keys(events), step.IDs[1], step.IDs[2])
	}
	if n := testkit.Count(t, a.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE enrollment_id = ?`, step.IDs[1]); n != 1 {
		t.Errorf("%d events for %s, completed once", n, step.IDs[1])
	}
	return a
}

// The predicted delete finds its rows by their primary keys, the
// reporting enrollment's own, and not through the step_id index every
// enrollment of the fan-out shares (which would lock other enrollments'
// index entries).
func TestThePredictedDeleteGoesByPrimaryKey(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	step := b.stored(t, "bykey", 300, 3)
	var stepID int64
	if err := b.db.QueryRow(`SELECT id FROM steps`).Scan(&stepID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(`ANALYZE TABLE id_commands`); err != nil {
		t.Fatal(err)
	}
	q, args := stepmysql.PredictedDelete(step.IDs[7], step.Commands[0].CommandUUID, stepID, []string{step.Commands[1].CommandUUID, step.Commands[2].CommandUUID})
	key, access := explainKey(t, b.db.DB, q, args...)
	if key != "PRIMARY" || access != "range" {
		t.Errorf("the predicted delete uses index %q (%s), want a range of PRIMARY", key, access)
	}
	q, args = stepmysql.PredictedStore(step.IDs[7], step.Commands[0].CommandUUID, stepID, []string{step.Commands[1].CommandUUID, step.Commands[2].CommandUUID})
	if key, access := explainKey(t, b.db.DB, q, args...); key != "PRIMARY" || access != "range" {
		t.Errorf("the predicted store uses index %q (%s), want a range of PRIMARY", key, access)
	}
}

// A result that leaves another of its enrollment's commands outstanding
// goes in one round trip too once this storage knows the step's commands
// (a fan-out's first enrollment showed them): the UPDATE writes its row
// and locks the others predicted outstanding, and the guard checks the
// tally of what it took. Each of an enrollment's three results goes so,
// the last completing the step with every result in its event. A guard
// that refused what the server did (a tally counted twice, or not at all)
// fails this test, on each server it runs on.
func TestAResultLeavingACommandOutstandingGoesInOneRoundTrip(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []stepmysql.Option{stepmysql.WithOutbox()}})
	if !stepmysql.TwoTrips(b.store) {
		t.Fatal("no multi-statement completions on this pool: nothing to predict")
	}
	ctx := t.Context()
	const cmds = 3
	step := b.storedOn(t, completionPaths[2], "store1", 2, cmds)
	stores0, storesRefused0 := stepmysql.OneTripStores(b.store)
	completions0, _ := stepmysql.OneTrips(b.store)
	for _, id := range []int{0, 1} {
		for c := range cmds - 1 {
			if r, err := b.answer(ctx, step, id, c); err != nil || r != nil {
				t.Fatalf("enrollment %s, command %d: %+v, %v; want stored, not complete", step.IDs[id], c, r, err)
			}
		}
		r, err := b.answer(ctx, step, id, cmds-1)
		if err != nil || r == nil {
			t.Fatalf("enrollment %s, last command: %+v, %v; want the completed step", step.IDs[id], r, err)
		}
		checkAllResults(t, step.IDs[id], r.Commands, cmds)
	}
	stores, storesRefused := stepmysql.OneTripStores(b.store)
	completions, refused := stepmysql.OneTrips(b.store)
	if stores-stores0 != 4 || storesRefused != storesRefused0 {
		t.Errorf("%d stores in one round trip, %d refused; want all 4, none refused", stores-stores0, storesRefused-storesRefused0)
	}
	if completions-completions0 != 2 || refused != 0 {
		t.Errorf("%d completions in one round trip, %d refused; want both, none refused", completions-completions0, refused)
	}
	events := outboxEvents(t, b)
	for _, id := range step.IDs {
		if ev, ok := events[id]; !ok || len(ev.Step.Commands) != cmds {
			t.Errorf("enrollment %s: event %+v, want one with %d commands", id, ev, cmds)
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
}

// A store another replica made stale is refused by its guard and leaves
// nothing of itself. For enrollment 0 the other replica stored the other
// command meanwhile, so this result completes the step (on the two-trip
// path, with both results); for enrollment 1 it stored this very command,
// which is then stored again and completes nothing.
func TestAStaleStorePredictionIsRefusedAndLeavesNothing(t *testing.T) {
	t.Parallel()
	onBothOneTripForms(t, aStaleStorePredictionIsRefused)
}

func aStaleStorePredictionIsRefused(t *testing.T, call bool) *bundle {
	a, b, step := staleReplicas(t, call, "stalestore", 2, 2)
	ctx := t.Context()
	stores0, refused0 := stepmysql.OneTripStores(a.store)

	if _, err := b.answer(ctx, step, 0, 1); err != nil {
		t.Fatal(err)
	}
	r, err := a.answer(ctx, step, 0, 0)
	if err != nil || r == nil {
		t.Fatalf("enrollment %s, its other command stored elsewhere: %+v, %v; want the completed step", step.IDs[0], r, err)
	}
	checkAllResults(t, step.IDs[0], r.Commands, 2)
	if stores, refused := stepmysql.OneTripStores(a.store); stores != stores0 || refused != refused0+1 {
		t.Errorf("%d stores committed in one round trip, %d refused; want the stale one refused", stores-stores0, refused-refused0)
	}

	if _, err := b.answer(ctx, step, 1, 0); err != nil {
		t.Fatal(err)
	}
	if r, err := a.answer(ctx, step, 1, 0); err != nil || r != nil {
		t.Fatalf("enrollment %s, its command stored elsewhere: %+v, %v; want stored again, not complete", step.IDs[1], r, err)
	}
	if _, refused := stepmysql.OneTripStores(a.store); refused != refused0+2 {
		t.Errorf("%d stores refused, want 2", refused-refused0)
	}
	r, err = a.answer(ctx, step, 1, 1)
	if err != nil || r == nil {
		t.Fatalf("enrollment %s, last command: %+v, %v; want the completed step", step.IDs[1], r, err)
	}
	checkAllResults(t, step.IDs[1], r.Commands, 2)
	events := outboxEvents(t, a)
	if len(events) != 2 {
		t.Errorf("events for %v, want one for each of %v", keys(events), step.IDs)
	}
	if c := countRows(t, a.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
	return a
}

// explainKey is the index EXPLAIN says q uses, and how (its type: a
// "range" of keys, or an "index" scan of all of it; FORMAT=TRADITIONAL
// where the server has it: MySQL's default is a tree).
func explainKey(t *testing.T, db *sql.DB, q string, args ...any) (key, access string) {
	t.Helper()
	rows, err := db.Query("EXPLAIN FORMAT=TRADITIONAL "+q, args...)
	if err != nil {
		rows, err = db.Query("EXPLAIN "+q, args...)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		for i, c := range cols {
			switch c {
			case "key":
				key = vals[i].String
			case "type":
				access = vals[i].String
			}
		}
	}
	return key, access
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// checkAllResults fails t unless cs are the cmds results of a fan-out
// enrollment, each whole.
func checkAllResults(t *testing.T, id string, cs []nanostorage.StepCommandResult, cmds int) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range cs {
		if string(c.ResultReport) != string(testkit.CommandResult(c.CommandUUID).ResultReport) || !c.Completed {
			t.Errorf("enrollment %s: command %s has result %q", id, c.CommandUUID, c.ResultReport)
		}
		seen[c.CommandUUID] = true
	}
	if len(seen) != cmds {
		t.Errorf("enrollment %s: completed step holds %d distinct commands, want %d", id, len(seen), cmds)
	}
}

// twoReplicas are two storages with the outbox on one new database, as
// two api replicas are: each with hints of its own.
// staleReplicas is twoReplicas with a fan-out of n enrollments of cmds
// commands stored on a, which knows its shape and so predicts (sending the
// routines' CALLs when call); b, predicting nothing of it yet, is the
// other replica that makes a's predictions stale.
func staleReplicas(t *testing.T, call bool, prefix string, n, cmds int) (a, b *bundle, step *nanostorage.StepEnqueuingWithConfig) {
	t.Helper()
	a, b = twoReplicas(t)
	if !call {
		stepmysql.NoProcedure(a.store)
	}
	return a, b, a.storedOn(t, completionPaths[2], prefix, n, cmds)
}

func twoReplicas(t *testing.T) (a, b *bundle) {
	t.Helper()
	opts := &setupOpts{db: testkit.NewDB(t, nil), extra: []stepmysql.Option{stepmysql.WithOutbox()}}
	return setup(t, opts), setup(t, opts)
}

// repeatableReadPool is db's database through a pool the storage did not
// open: multiStatements and interpolateParams on, the session at the
// server's default level, REPEATABLE READ; with foundRows, an UPDATE's
// count is of the rows it matched rather than changed.
func repeatableReadPool(t *testing.T, db *testkit.DB, foundRows bool) *testkit.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MultiStatements, cfg.InterpolateParams, cfg.ParseTime = true, true, true
	cfg.ClientFoundRows = foundRows
	for _, k := range []string{"tx_isolation", "transaction_isolation"} {
		delete(cfg.Params, k)
	}
	pool, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	pool.SetMaxOpenConns(testkit.PoolSize)
	t.Cleanup(func() { pool.Close() })
	return &testkit.DB{DB: pool, Name: db.Name, DSN: cfg.FormatDSN()}
}

// sessionIsolation is a new session's level on db, by the variable the
// server has (MariaDB 10.11 says tx_isolation, MySQL transaction_isolation).
func sessionIsolation(t *testing.T, db *sql.DB) string {
	t.Helper()
	var level string
	for _, v := range []string{"@@transaction_isolation", "@@tx_isolation"} {
		if err := db.QueryRow("SELECT " + v).Scan(&level); err == nil {
			return level
		}
	}
	t.Fatal(fmt.Errorf("no isolation variable answered"))
	return ""
}

// Behind a load balancer an enrollment's results reach different
// replicas. Here every enrollment's first result goes to a and its second
// to b, which has only the step's shape and so predicts each second result
// to be a first: refused. After a few refusals b stops predicting that
// command (but for one in oddsRetry, to see whether it changed), and so
// pays for a handful of refusals, not one per enrollment; a's first
// results go on in one round trip. Every enrollment completes once.
func TestAReplicaStopsPredictingWhatItsGuardKeepsRefusing(t *testing.T) {
	t.Parallel()
	a, b := twoReplicas(t)
	ctx := t.Context()
	const n = 80
	step := a.stored(t, "spread", n, 2)
	for i := range n {
		if r, err := a.answer(ctx, step, i, 0); err != nil || r != nil {
			t.Fatalf("enrollment %s, first command: %+v, %v", step.IDs[i], r, err)
		}
		r, err := b.answer(ctx, step, i, 1)
		if err != nil || r == nil {
			t.Fatalf("enrollment %s, second command: %+v, %v; want the completed step", step.IDs[i], r, err)
		}
		checkAllResults(t, step.IDs[i], r.Commands, 2)
	}
	aStores, aRefused := stepmysql.OneTripStores(a.store)
	bStores, bRefused := stepmysql.OneTripStores(b.store)
	t.Logf("a: %d stores in one round trip, %d refused; b: %d, %d", aStores, aRefused, bStores, bRefused)
	if aStores < n-2 || aRefused != 0 {
		t.Errorf("a: %d stores in one round trip and %d refused, want %d and none", aStores, aRefused, n-1)
	}
	// b's first second result teaches it the shape; 5 refusals stop it;
	// then one of each 32 it skips is tried
	if maxRefused := int64(5 + (n-6)/32 + 1); bRefused > maxRefused || bStores != 0 {
		t.Errorf("b: %d refused and %d committed, want at most %d refused and none committed", bRefused, bStores, maxRefused)
	}
	if events := outboxEvents(t, a); len(events) != n {
		t.Errorf("%d events, want %d", len(events), n)
	}
}

// Where the storage writes receipts instead of events (the NanoCMD
// drop-in), the guard rides on the receipt's INSERT: a stale prediction is
// refused there too and leaves neither rows nor a receipt, and a right one
// still commits in one round trip with its receipt.
func TestAStalePredictionIsRefusedWithReceiptsToo(t *testing.T) {
	t.Parallel()
	onBothOneTripForms(t, aStalePredictionIsRefusedWithReceipts)
}

func aStalePredictionIsRefusedWithReceipts(t *testing.T, call bool) *bundle {
	opts := &setupOpts{db: testkit.NewDB(t, nil), extra: []stepmysql.Option{stepmysql.WithReceipts()}}
	a, b := setup(t, opts), setup(t, opts)
	if !call {
		stepmysql.NoProcedure(a.store)
	}
	ctx := t.Context()
	step := a.storedOn(t, completionPaths[2], "stalercpt", 2, 2)
	warmCommitted, _ := stepmysql.OneTrips(a.store)
	receipts := func(id string) int {
		return testkit.Count(t, a.db.DB, `SELECT COUNT(*) FROM stepcollect_receipts WHERE enrollment_id = ?`, id)
	}

	// enrollment 1: a stores its first result, b cancels the enrollment
	if _, err := a.answer(ctx, step, 1, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.store.CancelSteps(ctx, step.IDs[1], ""); err != nil {
		t.Fatal(err)
	}
	if r, err := a.answer(ctx, step, 1, 1); r != nil || !errors.Is(err, storage.ErrUnknownCommand) {
		t.Fatalf("completing a cancelled enrollment: %+v, %v; want no step and the command unknown", r, err)
	}
	if committed, refused := stepmysql.OneTrips(a.store); refused != 1 || committed != warmCommitted {
		t.Errorf("%d committed in one round trip after the warm-up's %d, %d refused; want the stale one refused", committed-warmCommitted, warmCommitted, refused)
	}
	if n, r := a.enrollmentRows(t, step.IDs[1]), receipts(step.IDs[1]); n != 0 || r != 0 {
		t.Errorf("the cancelled enrollment holds %d rows and %d receipts, want none", n, r)
	}

	// enrollment 0: predicted right, one round trip, its receipt written
	if _, err := a.answer(ctx, step, 0, 0); err != nil {
		t.Fatal(err)
	}
	if r, err := a.answer(ctx, step, 0, 1); r == nil || err != nil {
		t.Fatalf("completing enrollment 0: %+v, %v", r, err)
	}
	if committed, _ := stepmysql.OneTrips(a.store); committed != warmCommitted+1 {
		t.Errorf("%d completions committed in one round trip after the warm-up, want 1", committed-warmCommitted)
	}
	if n, r := a.enrollmentRows(t, step.IDs[0]), receipts(step.IDs[0]); n != 0 || r != 1 {
		t.Errorf("the completed enrollment holds %d rows and %d receipts, want 0 and 1", n, r)
	}
	return a
}

// A fan-out this replica stored is predicted from its first result: every
// enrollment answering its commands at once, before any of them committed,
// goes in one round trip, none through the locking read, and each event
// carries the step's context as the server stored it. Before the storage
// learned the step's shape at StoreStep, every result in flight when the
// first one committed took the two round trips (a quarter of a burst's
// first 250 ms, docs/bench/pairs-2026-12-05c). Another replica, which did
// not store it, still completes its share correctly: in two round trips
// until it has seen one.
func TestAFanOutStoredHereIsPredictedFromItsFirstResult(t *testing.T) {
	t.Parallel()
	for _, cmds := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d commands", cmds), func(t *testing.T) {
			t.Parallel()
			db := testkit.NewDB(t, nil)
			opts := &setupOpts{db: db, extra: []stepmysql.Option{stepmysql.WithOutbox()}}
			a := setup(t, opts)
			if !stepmysql.TwoTrips(a.store) {
				t.Fatal("no multi-statement completions on this pool: nothing to predict")
			}
			const n = 96
			step := testkit.FanOut("seeded", n, cmds)
			step.Context = []byte("the step's own context")
			if err := a.store.StoreStep(t.Context(), step, time.Now()); err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var errs []error
			completed := 0
			// every enrollment's commands at once, the last command last
			for c := range cmds {
				startTogether(n, func(i int) {
					r, err := a.answer(t.Context(), step, i, c)
					mu.Lock()
					defer mu.Unlock()
					if err != nil {
						errs = append(errs, fmt.Errorf("enrollment %s, command %d: %w", step.IDs[i], c, err))
					}
					if r != nil {
						completed++
					}
				})
			}
			for _, err := range errs {
				t.Error(err)
			}
			if completed != n {
				t.Errorf("%d enrollments completed, want %d", completed, n)
			}
			committed, refused := stepmysql.OneTrips(a.store)
			if committed != n || refused != 0 {
				t.Errorf("completions in one round trip: %d committed, %d refused; want all %d committed, none refused", committed, refused, n)
			}
			if cmds > 1 {
				stores, storesRefused := stepmysql.OneTripStores(a.store)
				if want := int64(n * (cmds - 1)); stores != want || storesRefused != 0 {
					t.Errorf("results leaving a command outstanding in one round trip: %d committed, %d refused; want %d, none refused", stores, storesRefused, want)
				}
			}
			events := outboxEvents(t, a)
			if len(events) != n {
				t.Errorf("%d events, want %d", len(events), n)
			}
			for id, ev := range events {
				if string(ev.Step.Context) != string(step.Context) || ev.Step.WorkflowName != step.WorkflowName {
					t.Errorf("enrollment %s: event of step %q with context %q, want %q and %q", id, ev.Step.WorkflowName, ev.Step.Context, step.WorkflowName, step.Context)
					break
				}
			}
			requireRealConcurrency(t, a)

			// a replica that did not store the step
			b := setup(t, opts)
			other := testkit.FanOut("elsewhere", 4, cmds)
			if err := a.store.StoreStep(t.Context(), other, time.Now()); err != nil {
				t.Fatal(err)
			}
			for i := range other.IDs {
				for c := range cmds {
					r, err := b.answer(t.Context(), other, i, c)
					if err != nil {
						t.Fatal(err)
					}
					if (r != nil) != (c == cmds-1) {
						t.Fatalf("enrollment %s, command %d: completed %v", other.IDs[i], c, r != nil)
					}
				}
			}
			if c := countRows(t, a.db.DB); c.IDCommands != 0 {
				t.Errorf("rows left: %+v", c)
			}
		})
	}
}
