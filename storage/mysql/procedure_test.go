package mysql_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// The routines go by primary key, the reporting enrollment's own rows:
// with every other enrollment's rows of the step locked by another
// transaction, each row and its step_id index entry (the next
// enrollment's too), a predicted store and then a predicted completion of
// a two-command step (migration 12's routines), and the completion of a
// one-command step (migration 13's), still commit, each one CALL, at once.
// A statement that went through the step_id index, or a parameter
// converted to another character set (which keeps the primary key from
// serving), would wait for those locks until its context ended.
func TestTheRoutinesLockOnlyTheReportingEnrollmentsRows(t *testing.T) {
	t.Parallel()
	for _, cmds := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d-commands", cmds), func(t *testing.T) {
			t.Parallel()
			lockOnlyOwnRows(t, cmds)
		})
	}
}

func lockOnlyOwnRows(t *testing.T, cmds int) {
	b := setup(t, &setupOpts{extra: []stepmysql.Option{stepmysql.WithOutbox()}})
	ctx := t.Context()
	const n = 40
	step := b.storedOn(t, completionPaths[3], fmt.Sprintf("ownrows%d", cmds), n, cmds)
	const me = 17

	holder, err := b.db.DB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	tx, err := holder.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	locked := 0
	for i, id := range step.IDs {
		if i == me {
			continue
		}
		var one int
		for _, c := range step.Commands {
			// through the step_id index: its entry and the row are locked
			if err := tx.QueryRowContext(ctx, `SELECT 1 FROM id_commands FORCE INDEX (step_id) WHERE step_id = (SELECT id FROM steps) AND enrollment_id = ? AND command_uuid = ? FOR UPDATE`, id, c.CommandUUID).Scan(&one); err != nil {
				t.Fatalf("locking %s's row of %s: %v", id, c.CommandUUID, err)
			}
			locked++
		}
	}

	calls, singles := stepmysql.Calls(b.store), stepmysql.SingleCalls(b.store)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	began := time.Now()
	for c := range cmds - 1 {
		if r, err := b.answer(cctx, step, me, c); err != nil || r != nil {
			t.Fatalf("storing %s's result %d with the other %d rows of the step locked elsewhere: %+v, %v (after %v)", step.IDs[me], c, locked, r, err, time.Since(began))
		}
	}
	r, err := b.answer(cctx, step, me, cmds-1)
	if err != nil || r == nil {
		t.Fatalf("completing %s with the other %d rows of the step locked elsewhere: %+v, %v (after %v)", step.IDs[me], locked, r, err, time.Since(began))
	}
	if got := stepmysql.Calls(b.store) - calls; got != int64(cmds) {
		t.Errorf("%d results sent as a CALL, want all %d", got, cmds)
	}
	wantSingle := int64(0)
	if cmds == 1 {
		wantSingle = 1
	}
	if got := stepmysql.SingleCalls(b.store) - singles; got != wantSingle {
		t.Errorf("%d completions sent as stepcollect_complete_single, want %d", got, wantSingle)
	}
	if n := b.enrollmentRows(t, step.IDs[me]); n != 0 {
		t.Errorf("%s holds %d rows after its completion", step.IDs[me], n)
	}
	if len(r.Commands) != cmds {
		t.Errorf("the completed step carries %d commands, want %d", len(r.Commands), cmds)
	}
}

// A database the routine is not in (migrated by an older build, or
// dropped from under a running process) costs speed, not a result: the
// first completion that meets the missing routine (a one-command step's
// completion calls migration 13's) runs again on the two-round-trip path,
// the ones after it send the query, and every one commits with its event.
func TestCompletionsGoOnWithoutTheRoutine(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []stepmysql.Option{stepmysql.WithOutbox()}})
	ctx := t.Context()
	const n = 6
	step := b.storedOn(t, completionPaths[3], "noroutine", n, 1)
	if r, err := b.answer(ctx, step, 0, 0); err != nil || r == nil {
		t.Fatalf("completing %s: %+v, %v", step.IDs[0], r, err)
	}
	calls := stepmysql.Calls(b.store)
	if calls == 0 {
		t.Fatal("no completion was sent as a CALL while the routine was there")
	}
	if stepmysql.SingleCalls(b.store) != calls {
		t.Fatalf("%d of %d completions of a one-command step sent as stepcollect_complete_single", stepmysql.SingleCalls(b.store), calls)
	}
	if _, err := b.db.Exec(`DROP PROCEDURE stepcollect_complete_single`); err != nil {
		t.Fatal(err)
	}
	committed, _ := stepmysql.OneTrips(b.store)
	for i := 1; i < n; i++ {
		if r, err := b.answer(ctx, step, i, 0); err != nil || r == nil {
			t.Fatalf("completing %s without the routine: %+v, %v", step.IDs[i], r, err)
		}
	}
	if got := stepmysql.Calls(b.store); got != calls {
		t.Errorf("%d completions committed as a CALL without the routine", got-calls)
	}
	// the first without it went on two round trips, the others in one
	if after, _ := stepmysql.OneTrips(b.store); after-committed != n-2 {
		t.Errorf("%d completions in one round trip without the routine, want %d", after-committed, n-2)
	}
	if events := outboxEvents(t, b); len(events) != n {
		t.Errorf("%d events, want %d", len(events), n)
	}
	if c := countRows(t, b.db.DB); c.IDCommands != 0 {
		t.Errorf("rows left: %+v", c)
	}
}

// A routine whose enrollment and command parameters are not in
// id_commands' character set would have the server convert the column to
// compare, and no key would serve the deletes: the storage does not call
// it, and completions send the query.
func TestARoutineInAnotherCharacterSetIsNotCalled(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, nil)
	opts := &setupOpts{db: db, extra: []stepmysql.Option{stepmysql.WithOutbox()}}
	b := setup(t, opts)
	// the same signatures, their text parameters in latin1; never to run
	for name, params := range map[string]string{
		"stepcollect_complete_predicted": `IN p_step BIGINT, IN p_others MEDIUMTEXT, IN p_others_n INT, IN p_event_id VARCHAR(64),
    IN p_event_type VARCHAR(32), IN p_payload LONGBLOB, IN p_receipt BOOLEAN`,
		"stepcollect_complete_single": `IN p_step BIGINT, IN p_event_id VARCHAR(64), IN p_event_type VARCHAR(32), IN p_payload LONGBLOB`,
	} {
		if _, err := db.Exec(`DROP PROCEDURE ` + name); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`CREATE PROCEDURE ` + name + `(
    IN p_enrollment VARCHAR(255) CHARACTER SET latin1, IN p_command VARCHAR(127) CHARACTER SET latin1, ` + params + `)
    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'called'`); err != nil {
			t.Fatal(err)
		}
	}
	answeredWithoutACall(t, b, "latin1", 1)
}

// answeredWithoutACall answers four enrollments of a fan-out of cmds
// commands on b, predicted, and fails t unless every result committed,
// none as a CALL, each completion in one round trip and none refused.
func answeredWithoutACall(t *testing.T, b *bundle, prefix string, cmds int) {
	t.Helper()
	const n = 4
	step := b.storedOn(t, completionPaths[3], prefix, n, cmds)
	committed, _ := stepmysql.OneTrips(b.store)
	for i := range n {
		for c := range cmds {
			if r, err := b.answer(t.Context(), step, i, c); err != nil || (r == nil) != (c < cmds-1) {
				t.Fatalf("enrollment %s, command %d: %+v, %v", step.IDs[i], c, r, err)
			}
		}
	}
	if got := stepmysql.Calls(b.store); got != 0 {
		t.Errorf("%d results sent as a CALL", got)
	}
	if after, refused := stepmysql.OneTrips(b.store); after-committed != n || refused != 0 {
		t.Errorf("%d completions in one round trip and %d refused, want %d and none", after-committed, refused, n)
	}
}

// On MariaDB with its binary log on, migration 12's routines cost the
// server more than they save the client, migration 13's does not
// (docs/benchmarks.md): there the results of a two-command step send their
// statements, and a one-command step's completion calls
// stepcollect_complete_single.
func TestOnMariaDBWithItsBinaryLogOnlySingleCompletionsCall(t *testing.T) {
	t.Parallel()
	srv, err := testha.RunMariaDB(testha.MariaDBConfig{LogBin: true})
	if err != nil {
		t.Fatalf("starting a private mariadbd with its binary log: %v", err)
	}
	t.Cleanup(srv.Stop)
	db := testkit.NewDB(t, &testkit.DBOptions{Server: srv.DSN()})
	b := setup(t, &setupOpts{db: db, extra: []stepmysql.Option{stepmysql.WithOutbox()}})
	answeredWithoutACall(t, b, "logbin", 2)

	const n = 4
	step := b.storedOn(t, completionPaths[3], "logbinsingle", n, 1)
	calls, singles := stepmysql.Calls(b.store), stepmysql.SingleCalls(b.store)
	for i := range n {
		if r, err := b.answer(t.Context(), step, i, 0); err != nil || r == nil {
			t.Fatalf("completing %s: %+v, %v", step.IDs[i], r, err)
		}
	}
	if got := stepmysql.SingleCalls(b.store) - singles; got != n {
		t.Errorf("%d of %d completions of a one-command step sent as stepcollect_complete_single", got, n)
	}
	if got := stepmysql.Calls(b.store) - calls; got != n {
		t.Errorf("%d results sent as a CALL, want the %d completions", got, n)
	}
}

// A database restored from a dump taken without its routines has the
// schema version that created the routine and not the routine: migrate
// creates it again, and completions call it.
func TestMigrateCreatesTheRoutineAgain(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, nil)
	routines := func() int {
		return testkit.Count(t, db.DB, `SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME IN ('stepcollect_complete_predicted', 'stepcollect_store_predicted', 'stepcollect_complete_single')`)
	}
	if n := routines(); n != 3 {
		t.Fatalf("%d routines after migrating, want 3", n)
	}
	for _, drop := range []string{"stepcollect_complete_predicted", "stepcollect_store_predicted", "stepcollect_complete_single"} {
		if _, err := db.Exec(`DROP PROCEDURE ` + drop); err != nil {
			t.Fatal(err)
		}
		if err := stepmysql.Migrate(t.Context(), db.DB); err != nil {
			t.Fatalf("migrating again without %s: %v", drop, err)
		}
		if n := routines(); n != 3 {
			t.Fatalf("%d routines after migrating again without %s, want 3", n, drop)
		}
	}
	b := setup(t, &setupOpts{db: db, extra: []stepmysql.Option{stepmysql.WithOutbox()}})
	step := b.storedOn(t, completionPaths[3], "restored", 2, 2)
	calls := stepmysql.Calls(b.store) // the warm-up's
	for i := range 2 {
		if _, err := b.answer(t.Context(), step, i, 0); err != nil {
			t.Fatalf("storing %s's first result: %v", step.IDs[i], err)
		}
		if r, err := b.answer(t.Context(), step, i, 1); err != nil || r == nil {
			t.Fatalf("completing %s: %+v, %v", step.IDs[i], r, err)
		}
	}
	if n := stepmysql.Calls(b.store) - calls; n != 4 {
		t.Errorf("%d results called the routines migrate created again, want all 4", n)
	}
	single := b.storedOn(t, completionPaths[3], "restoredsingle", 2, 1)
	singles := stepmysql.SingleCalls(b.store)
	for i := range 2 {
		if r, err := b.answer(t.Context(), single, i, 0); err != nil || r == nil {
			t.Fatalf("completing %s: %+v, %v", single.IDs[i], r, err)
		}
	}
	if n := stepmysql.SingleCalls(b.store) - singles; n != 2 {
		t.Errorf("%d one-command completions called stepcollect_complete_single after migrate created it again, want both", n)
	}
}

// BenchmarkPredictedResults completes b.N enrollments of a fan-out, 64
// at a time, each result predicted (one round trip; the last with its
// event), sent as the multi-statement queries or as the routines' CALLs:
// one command a step (a completion each), or two (a store, then a
// completion: an op is both). Beside the time an op it reports this
// process's CPU an op (the client's), and the server's when
// STEPCOLLECT_BENCH_SERVER_PID names its process on this machine:
//
//	STEPCOLLECT_BENCH_SERVER_PID=$(pidof mariadbd) go test -run '^$' \
//	  -bench PredictedResults -benchtime 10000x ./storage/mysql/
func BenchmarkPredictedResults(b *testing.B) {
	serverPID, _ := strconv.Atoi(os.Getenv("STEPCOLLECT_BENCH_SERVER_PID"))
	for _, cmds := range []int{1, 2} {
		for _, form := range []string{"query", "call"} {
			b.Run(fmt.Sprintf("%d-commands/%s", cmds, form), func(b *testing.B) {
				predictedResults(b, serverPID, cmds, form == "call")
			})
		}
	}
}

func predictedResults(b *testing.B, serverPID, cmds int, call bool) {
	bd := setup(b, &setupOpts{extra: []stepmysql.Option{stepmysql.WithOutbox()}})
	if !call {
		stepmysql.NoProcedure(bd.store)
	}
	ctx := context.Background()
	step := testkit.FanOut("benchresults", b.N+1, cmds)
	if err := bd.store.StoreStep(ctx, step, time.Now()); err != nil {
		b.Fatal(err)
	}
	// the first enrollment shows the step's shape: the others are predicted
	for c := range cmds {
		if _, err := bd.answer(ctx, step, b.N, c); err != nil {
			b.Fatal(err)
		}
	}
	next := make(chan int, b.N)
	for i := range b.N {
		next <- i
	}
	close(next)
	var failed error
	var once sync.Once
	server0, client0 := processCPU(b, serverPID), selfCPU()
	b.ResetTimer()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for i := range next {
				for c := range cmds {
					r, err := bd.answer(ctx, step, i, c)
					if err != nil || (r == nil) != (c < cmds-1) {
						once.Do(func() { failed = fmt.Errorf("enrollment %s, command %d: %+v, %v", step.IDs[i], c, r, err) })
					}
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if failed != nil {
		b.Fatal(failed)
	}
	if n := stepmysql.Calls(bd.store); call != (n > 0) {
		b.Fatalf("%d results sent as a CALL, with the routines on: %v", n, call)
	}
	b.ReportMetric(float64(selfCPU()-client0)/float64(b.N)/1e3, "client-µs/op")
	if serverPID > 0 {
		b.ReportMetric(float64(processCPU(b, serverPID)-server0)/float64(b.N)/1e3, "server-µs/op")
	}
}

// selfCPU is this process's CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processCPU is process pid's CPU time so far; 0 for pid 0.
func processCPU(b *testing.B, pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	d, err := testkit.ProcessCPU(pid)
	if err != nil {
		b.Fatalf("STEPCOLLECT_BENCH_SERVER_PID: %v", err)
	}
	return d
}
