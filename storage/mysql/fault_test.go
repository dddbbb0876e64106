package mysql_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// faultConnector wraps go-sql-driver's connector to break things on cue:
// KILL a connection from the server side just before a chosen statement (a
// connection that breaks mid-transaction), or let a COMMIT succeed and then
// report its answer lost (a COMMIT whose outcome the client cannot know).
type faultConnector struct {
	base  driver.Connector
	admin *sql.DB

	mu          sync.Mutex
	killBefore  string // substring of the statement to kill before, once
	loseCommits int    // how many successful COMMITs to report as lost
	killed      int
	lost        int

	// failBefore makes the next statement containing it fail with failErr
	// instead of running (an injected deadlock, say), once.
	failBefore string
	failErr    error
	failed     int
	// dropCommits rolls back instead of committing and reports the answer
	// lost (ErrInvalidConn): a COMMIT that never reached the server.
	dropCommits int
	// refuseCommits rolls back and answers with the server error refuseErr
	// (1927, 1053, 1317): a COMMIT the server answered "no" to.
	refuseCommits int
	refuseErr     error
	// betweenTries runs after a faulty COMMIT, before its error reaches
	// the storage (and so before the retry): what another client does in
	// that window.
	betweenTries func()
	dropped      int
	refused      int
	// twoTrips counts the COMMITs sent at the end of a multi-statement
	// query rather than by Tx.Commit; oneTrips those of them in a query
	// that also began the transaction (a completion in one round trip).
	twoTrips int
	oneTrips int
	calls    int // of oneTrips, those sent as a routine's CALL
	// A server gone silent (cut off the network, or a Group Replication
	// primary without its majority): stallBefore holds the next statement
	// containing it without running it, stallCommits holds that many
	// COMMITs after they committed, each until the caller's context ends,
	// then answers as go-sql-driver does, its connection closed.
	stallBefore  string
	stallCommits int
	stalled      int
	// timedOut counts the connections, statements and COMMITs that were
	// not held and failed all the same with their try's context ended: a
	// try that outran its bound on a slow machine, retried as a held one is.
	timedOut int
	// down refuses every new connection (as a server that stopped
	// listening does) and fails every statement on an open one with
	// driver.ErrBadConn, until cleared.
	down bool
	// slowBefore makes every statement containing it take slowBy longer
	// (a busy server: each statement answers, slowly).
	slowBefore string
	slowBy     time.Duration
}

// isDown says whether the server is down.
func (c *faultConnector) isDown() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.down
}

func newFaultDB(t *testing.T, db *testkit.DB, multi bool) (*sql.DB, *faultConnector) {
	t.Helper()
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MultiStatements = multi
	base, err := mysql.NewConnector(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fc := &faultConnector{base: base, admin: db.DB}
	fdb := sql.OpenDB(fc)
	fdb.SetMaxOpenConns(testkit.PoolSize)
	t.Cleanup(func() { fdb.Close() })
	return fdb, fc
}

// arm sets the faults to come, under the connector's lock.
func (c *faultConnector) arm(set func(*faultConnector)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	set(c)
}

func (c *faultConnector) Driver() driver.Driver { return c.base.Driver() }

func (c *faultConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.connect(ctx)
	c.noteTimeout(ctx, err)
	return conn, err
}

// noteTimeout counts err if it ended a call nothing held, by its context.
func (c *faultConnector) noteTimeout(ctx context.Context, err error) {
	if err != nil && ctx.Err() != nil {
		c.mu.Lock()
		c.timedOut++
		c.mu.Unlock()
	}
}

// timeouts is how many calls nothing held ended with their try's context.
func (c *faultConnector) timeouts() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.timedOut
}

func (c *faultConnector) connect(ctx context.Context) (driver.Conn, error) {
	if c.isDown() {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	conn, err := c.base.Connect(ctx)
	if err != nil {
		return nil, err
	}
	// the session as OpenDB sets it up, which a connector of its own skips
	if _, err := conn.(driver.ExecerContext).ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED", nil); err != nil {
		conn.Close()
		return nil, err
	}
	rows, err := conn.(driver.QueryerContext).QueryContext(ctx, "SELECT CONNECTION_ID()", nil)
	if err != nil {
		conn.Close()
		return nil, err
	}
	defer rows.Close()
	dest := make([]driver.Value, 1)
	if err := rows.Next(dest); err != nil && err != io.EOF {
		conn.Close()
		return nil, err
	}
	return &faultConn{Conn: conn, id: dest[0], c: c}, nil
}

func (c *faultConnector) maybeKill(ctx context.Context, id driver.Value, query string) {
	c.mu.Lock()
	hit := c.killBefore != "" && strings.Contains(query, c.killBefore)
	if hit {
		c.killBefore = ""
		c.killed++
	}
	c.mu.Unlock()
	if hit {
		c.admin.ExecContext(ctx, "KILL CONNECTION ?", id)
		// wait until the server shows it gone, not for a guessed while
		testkit.Watch(time.Now().Add(5*time.Second), func() bool {
			var n int
			err := c.admin.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.processlist WHERE id = ?`, id).Scan(&n)
			return err != nil || n == 0
		})
	}
}

// takeStall says whether query is the statement to hold (once).
func (c *faultConnector) takeStall(query string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stallBefore != "" && strings.Contains(query, c.stallBefore) {
		c.stallBefore = ""
		c.stalled++
		return true
	}
	return false
}

// takeStalledCommit says whether the COMMIT about to run is held.
func (c *faultConnector) takeStalledCommit() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stallCommits > 0 {
		c.stallCommits--
		c.stalled++
		return true
	}
	return false
}

// silent answers as go-sql-driver does when the context ends while it
// waits for the server: the connection closed, the context's error.
func (f *faultConn) silent(ctx context.Context) error {
	<-ctx.Done()
	f.Conn.Close()
	return ctx.Err()
}

func (c *faultConnector) takeLostCommit() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.loseCommits > 0 {
		c.loseCommits--
		c.lost++
		return true
	}
	return false
}

type faultConn struct {
	driver.Conn
	id driver.Value
	c  *faultConnector
}

func (f *faultConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	if f.c.isDown() {
		return nil, driver.ErrBadConn
	}
	tx, err := f.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		f.c.noteTimeout(ctx, err)
		return nil, err
	}
	return &faultTx{Tx: tx, c: f.c, f: f, ctx: ctx}, nil
}

func (c *faultConnector) takeFailure(query string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.failBefore != "" && strings.Contains(query, c.failBefore) {
		c.failBefore = ""
		c.failed++
		return c.failErr
	}
	return nil
}

func (f *faultConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	if f.c.isDown() {
		return nil, driver.ErrBadConn
	}
	if err := f.c.takeFailure(query); err != nil {
		return nil, err
	}
	f.c.maybeKill(ctx, f.id, query)
	if f.c.takeStall(query) {
		return nil, f.silent(ctx)
	}
	f.c.mu.Lock()
	slow := f.c.slowBefore != "" && strings.Contains(query, f.c.slowBefore)
	by := f.c.slowBy
	f.c.mu.Unlock()
	if slow {
		select {
		case <-ctx.Done():
			f.Conn.Close()
			return nil, ctx.Err()
		case <-time.After(by):
		}
	}
	res, held, err := f.execContext(ctx, query, args)
	if !held {
		f.c.noteTimeout(ctx, err)
	}
	return res, err
}

// execContext is ExecContext past the faults taken before a statement
// runs; held says its COMMIT was held (stallCommits).
func (f *faultConn) execContext(ctx context.Context, query string, args []driver.NamedValue) (_ driver.Result, held bool, _ error) {
	exec := f.Conn.(driver.ExecerContext).ExecContext
	stmts, commits := strings.CutSuffix(query, "; COMMIT")
	// The routines (procedure.go) begin, run and commit a transaction in
	// one CALL.
	called := strings.HasPrefix(query, "CALL stepcollect_")
	if !commits && !called {
		res, err := exec(ctx, query, args)
		return res, false, err
	}
	// A COMMIT sent with the statements before it: the same faults as
	// faultTx.Commit's.
	between, fault := f.c.takeCommitFault()
	f.c.mu.Lock()
	f.c.twoTrips++
	if called || strings.HasPrefix(query, "START TRANSACTION;") {
		f.c.oneTrips++
	}
	if called {
		f.c.calls++
	}
	f.c.mu.Unlock()
	switch {
	case called && fault != nil:
		// A CALL is one statement: never sent, or run and rolled back
		// at its COMMIT, nothing of it stays; skipping it is either.
	case errors.Is(fault, mysql.ErrInvalidConn):
		// nothing reached the server, and the connection the server saw
		// go rolled back what it held
		if _, err := exec(ctx, "ROLLBACK", nil); err != nil {
			return nil, false, err
		}
	case fault != nil:
		// the statements ran and the server answered no to COMMIT
		if _, err := exec(ctx, stmts+"; ROLLBACK", args); err != nil {
			return nil, false, err
		}
	}
	if fault != nil {
		if between != nil {
			between()
		}
		return nil, false, fault
	}
	res, err := exec(ctx, query, args)
	if err != nil {
		return nil, false, err
	}
	if f.c.takeStalledCommit() {
		return nil, true, f.silent(ctx)
	}
	if f.c.takeLostCommit() {
		if between != nil {
			between()
		}
		return nil, false, mysql.ErrInvalidConn // committed, but the client never heard
	}
	return res, false, nil
}

func (f *faultConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	if f.c.isDown() {
		return nil, driver.ErrBadConn
	}
	if err := f.c.takeFailure(query); err != nil {
		return nil, err
	}
	f.c.maybeKill(ctx, f.id, query)
	if f.c.takeStall(query) {
		return nil, f.silent(ctx)
	}
	rows, err := f.Conn.(driver.QueryerContext).QueryContext(ctx, query, args)
	f.c.noteTimeout(ctx, err)
	return rows, err
}

func (f *faultConn) PrepareContext(ctx context.Context, query string) (driver.Stmt, error) {
	return f.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, query)
}

func (f *faultConn) Ping(ctx context.Context) error { return f.Conn.(driver.Pinger).Ping(ctx) }

func (f *faultConn) ResetSession(ctx context.Context) error {
	return f.Conn.(driver.SessionResetter).ResetSession(ctx)
}

func (f *faultConn) IsValid() bool { return f.Conn.(driver.Validator).IsValid() }

func (f *faultConn) CheckNamedValue(nv *driver.NamedValue) error {
	return f.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

type faultTx struct {
	driver.Tx
	c   *faultConnector
	f   *faultConn
	ctx context.Context // the transaction's, which a held COMMIT waits on
}

func (t *faultTx) Commit() error {
	between, fault := t.c.takeCommitFault()
	if fault != nil {
		if err := t.Tx.Rollback(); err != nil {
			return err
		}
		if between != nil {
			between()
		}
		return fault
	}
	if err := t.Tx.Commit(); err != nil {
		t.c.noteTimeout(t.ctx, err)
		return err
	}
	if t.c.takeStalledCommit() {
		return t.f.silent(t.ctx)
	}
	if t.c.takeLostCommit() {
		if between != nil {
			between()
		}
		return mysql.ErrInvalidConn // committed, but the client never heard
	}
	return nil
}

// takeCommitFault says what runs between the tries, and what the next
// COMMIT meets: nil (it commits), or the error it answers after rolling
// back instead.
func (c *faultConnector) takeCommitFault() (func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var fault error
	switch {
	case c.dropCommits > 0:
		c.dropCommits--
		c.dropped++
		fault = mysql.ErrInvalidConn // never reached the server
	case c.refuseCommits > 0:
		c.refuseCommits--
		c.refused++
		fault = c.refuseErr // the server said no
	}
	return c.betweenTries, fault
}

// completionPaths are the ways a completion runs, each to be faulted:
// database/sql's transaction (a pool without multiStatements, as WithDB may
// give), two round trips (OpenDB's pools, predictions off), and one round
// trip where the storage predicts what it will find (onetrip.go: the
// results of an enrollment of a fan-out whose commands it knows), sent as
// the multi-statement query (the routines off) or, as it is where
// migrations 12 and 13 ran, as one CALL of a routine (procedure.go; a
// one-command step's completion with its event calls migration 13's).
type completionPath struct {
	name                 string
	multi, predict, call bool
}

var completionPaths = []completionPath{
	{"database-sql", false, false, false},
	{"two-round-trips", true, false, false},
	{"one-round-trip", true, true, false},
	{"one-round-trip-call", true, true, true},
}

// killBeforeRelease is the statement a completion on p releases its rows
// with: the release or the predicted delete, or the CALL of either
// completion's routine.
func (p completionPath) killBeforeRelease() string {
	if p.call {
		return "CALL stepcollect_complete_"
	}
	return "DELETE FROM id_commands WHERE"
}

// onEveryPath runs test on each completion path.
func onEveryPath(t *testing.T, test func(t *testing.T, p completionPath)) {
	for _, p := range completionPaths {
		t.Run(p.name, func(t *testing.T) { test(t, p) })
	}
}

// checkPath fails t unless the completions ran the path asked for.
func (c *faultConnector) checkPath(t *testing.T, p completionPath) {
	t.Helper()
	c.mu.Lock()
	n, one := c.twoTrips, c.oneTrips
	c.mu.Unlock()
	if p.multi && n == 0 {
		t.Fatal("no COMMIT was sent with its statements: the multi-statement path never ran")
	}
	if !p.multi && n > 0 {
		t.Fatalf("%d COMMITs were sent with their statements on a pool without multiStatements", n)
	}
	if p.predict && one == 0 {
		t.Fatal("no completion was sent whole in one round trip: the predicted path never ran")
	}
	if !p.predict && one > 0 {
		t.Fatalf("%d completions were sent in one round trip with predictions off", one)
	}
	c.mu.Lock()
	calls := c.calls
	c.mu.Unlock()
	if p.call && calls == 0 {
		t.Fatal("no completion was sent as a CALL: the routine never ran")
	}
	if !p.call && calls > 0 {
		t.Fatalf("%d completions were sent as a CALL with the routine off", calls)
	}
}

// storedOn stores a fan-out as b.stored does and, on a path that predicts,
// first completes one more enrollment of it, as a fan-out's first
// enrollment does: the storage then knows the step's commands and keeps
// its context, and the test's own results go in one round trip. The extra
// enrollment is not among the step's IDs, and its event is taken out of
// the outbox again.
func (b *bundle) storedOn(t *testing.T, p completionPath, prefix string, n, cmds int) *nanostorage.StepEnqueuingWithConfig {
	t.Helper()
	if !p.predict {
		return b.stored(t, prefix, n, cmds)
	}
	step := b.stored(t, prefix, n+1, cmds)
	for c := range cmds {
		if _, err := b.answer(t.Context(), step, n, c); err != nil {
			t.Fatalf("warming the storage with enrollment %s: %v", step.IDs[n], err)
		}
	}
	if _, err := b.db.Exec(`DELETE FROM stepcollect_outbox WHERE enrollment_id = ?`, step.IDs[n]); err != nil {
		t.Fatal(err)
	}
	step.IDs = step.IDs[:n]
	return step
}

// setupFaulty is a storage on a faulty pool with multiStatements on, the
// path OpenDB's pools take; setupFaultyPath chooses.
func setupFaulty(t *testing.T, extra ...stepmysql.Option) (*bundle, *faultConnector) {
	t.Helper()
	return setupFaultyPath(t, completionPaths[3], extra...)
}

func setupFaultyPath(t *testing.T, p completionPath, extra ...stepmysql.Option) (*bundle, *faultConnector) {
	t.Helper()
	db := testkit.NewDB(t, nil)
	fdb, fc := newFaultDB(t, db, p.multi)
	faulty := &testkit.DB{DB: fdb, Name: db.Name, DSN: db.DSN}
	b := setup(t, &setupOpts{db: faulty, extra: extra})
	if !p.predict {
		stepmysql.NoPredictions(b.store)
	}
	if !p.call {
		stepmysql.NoProcedure(b.store)
	}
	return b, fc
}

func TestConnectionKilledMidTransactionIsRetriedAndTheResultCommitted(t *testing.T) {
	t.Parallel()
	onEveryPath(t, connectionKilledMidTransaction)
}

func connectionKilledMidTransaction(t *testing.T, multi completionPath) {
	b, fc := setupFaultyPath(t, multi)
	ctx := t.Context()
	step := b.storedOn(t, multi, "killed", 2, 1)
	fc.arm(func(fc *faultConnector) {
		fc.killBefore = multi.killBeforeRelease()
	})

	r, err := b.answer(ctx, step, 0, 0)
	if err != nil || r == nil {
		t.Fatalf("result across a killed connection: %v, %v", r, err)
	}
	if fc.killed != 1 {
		t.Fatalf("the connection was killed %d times, want 1: the fault never happened", fc.killed)
	}
	if retries, _ := b.obs.snapshot(); retries["store command result/connection"] != 1 {
		t.Errorf("retries %v, want one connection retry", retries)
	}
	left := b.enrollmentRows(t, step.IDs[0])
	if left != 0 {
		t.Errorf("rows of the enrollment left: %d", left)
	}
	fc.checkPath(t, multi)
}

// A COMMIT that went through but whose answer was lost is retried; the retry
// finds the rows gone, finds the step.completed event that COMMIT wrote (or,
// without the outbox, its receipt), and so returns the completed step it had
// built, not "unknown command": the result is committed and the caller must
// get it.
func TestLostCommitAnswerOnTheCompletingResultStillReturnsTheStep(t *testing.T) {
	t.Parallel()
	for name, opt := range map[string]stepmysql.Option{"outbox": stepmysql.WithOutbox(), "receipts": stepmysql.WithReceipts()} {
		t.Run(name, func(t *testing.T) {
			onEveryPath(t, func(t *testing.T, multi completionPath) { lostCommitAnswerOnTheCompletingResult(t, multi, opt) })
		})
	}
}

func lostCommitAnswerOnTheCompletingResult(t *testing.T, multi completionPath, opt stepmysql.Option) {
	b, fc := setupFaultyPath(t, multi, opt)
	ctx := t.Context()
	step := b.storedOn(t, multi, "lostcommit", 1, 2)

	// first command, with its commit answer lost: a retry re-records it
	fc.arm(func(fc *faultConnector) { fc.loseCommits = 1 })
	r, err := b.answer(ctx, step, 0, 0)
	if err != nil || r != nil {
		t.Fatalf("first command: %v, %v; want stored, not complete", r, err)
	}

	// last command, with its commit answer lost: the step comes back anyway
	fc.arm(func(fc *faultConnector) { fc.loseCommits = 1 })
	r, err = b.answer(ctx, step, 0, 1)
	if err != nil || r == nil {
		t.Fatalf("last command: %v, %v; want the completed step", r, err)
	}
	if fc.lost != 2 {
		t.Fatalf("lost %d commit answers, want 2: the fault never happened", fc.lost)
	}
	if len(r.Commands) != 2 {
		t.Fatalf("completed step holds %d commands, want 2", len(r.Commands))
	}
	for _, c := range r.Commands {
		if string(c.ResultReport) != string(testkit.CommandResult(c.CommandUUID).ResultReport) {
			t.Errorf("command %s: result %q", c.CommandUUID, c.ResultReport)
		}
	}
	if retries, _ := b.obs.snapshot(); retries["store command result/connection"] != 2 {
		t.Errorf("retries %v, want two connection retries", retries)
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
	fc.checkPath(t, multi)
}

// A server that goes silent (cut off the network, or a Group Replication
// primary that lost its majority and holds every COMMIT) costs a result one
// try's bound, not the request: the try is given up after
// WithAttemptTimeout, its connection closed, and the transaction run again
// on a fresh one. A COMMIT held so, which had in fact committed, is
// settled by evidence on the next try: the completed step comes back, with
// one event, not an error and not two.
func TestASilentServerCostsOneTryNotTheRequest(t *testing.T) {
	t.Parallel()
	onEveryPath(t, aSilentServerCostsOneTry)
}

func aSilentServerCostsOneTry(t *testing.T, multi completionPath) {
	// far above what a try takes, even on a busy machine: a try that
	// outruns it all the same is counted below
	const bound = time.Second
	b, fc := setupFaultyPath(t, multi, stepmysql.WithOutbox(), stepmysql.WithAttemptTimeout(bound))
	ctx := t.Context()
	step := b.storedOn(t, multi, "silent", 1, 2)

	// the first command's locking read meets the silence, or, predicted,
	// its whole transaction
	first := "FOR UPDATE"
	switch {
	case multi.call:
		first = "CALL stepcollect_store_predicted("
	case multi.predict:
		first = "DO LAST_INSERT_ID(0)"
	}
	fc.arm(func(fc *faultConnector) { fc.stallBefore = first })
	began := time.Now()
	r, err := b.answer(ctx, step, 0, 0)
	took := time.Since(began)
	if err != nil || r != nil {
		t.Fatalf("first command, its read held: %v, %v; want stored, not complete", r, err)
	}
	if took < bound || took > 15*time.Second {
		t.Errorf("first command took %v: want one try's bound (%v), then a prompt retry", took, bound)
	}

	// the last command's COMMIT commits and its answer never comes
	fc.arm(func(fc *faultConnector) { fc.stallCommits = 1 })
	r, err = b.answer(ctx, step, 0, 1)
	if err != nil || r == nil {
		t.Fatalf("last command, its COMMIT held: %v, %v; want the completed step", r, err)
	}
	if fc.stalled != 2 {
		t.Fatalf("%d statements held, want 2: the fault never happened", fc.stalled)
	}
	// one retry a held statement, and one for each try that outran the
	// bound on its own (CI once saw a third on MySQL 9.7 under load)
	slow := fc.timeouts()
	if retries, _ := b.obs.snapshot(); retries["store command result/connection"] != 2+slow {
		t.Errorf("retries %v, want %d connection retries: one for each of the 2 held statements and of the %d tries that outran the bound on their own", retries, 2+slow, slow)
	} else if slow > 0 {
		t.Logf("tries that outran the %v bound on their own, and were retried: %d", bound, slow)
	}
	var events int
	if err := b.db.DB.QueryRow("SELECT COUNT(*) FROM stepcollect_outbox").Scan(&events); err != nil || events != 1 {
		t.Errorf("outbox holds %d events (%v), want the one completion's", events, err)
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
	fc.checkPath(t, multi)
}

// Collection's reference check runs outside a transaction, and is bounded
// all the same: against a silent server it fails within one bound (the
// collect task is retried), rather than holding a worker until TCP gives
// up; the next try collects the step.
func TestASilentServerBoundsTheReferenceCheck(t *testing.T) {
	t.Parallel()
	const bound = 300 * time.Millisecond
	b, fc := setupFaultyPath(t, completionPaths[2], stepmysql.WithAttemptTimeout(bound))
	b.stored(t, "silentcheck", 1, 1)
	var stepID int64
	if err := b.db.DB.QueryRow("SELECT id FROM steps").Scan(&stepID); err != nil {
		t.Fatal(err)
	}
	// unreferenced, as a completion that handed it over leaves it
	if _, err := b.db.Exec(`DELETE FROM id_commands WHERE step_id = ?`, stepID); err != nil {
		t.Fatal(err)
	}
	// the caller's own limit, far above the bound: what a hang would reach
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	fc.arm(func(fc *faultConnector) { fc.stallBefore = "EXISTS (SELECT 1 FROM id_commands" })
	began := time.Now()
	_, err := b.store.Collect(ctx, []storage.ReleasedStep{{ID: stepID, ObservedAt: time.Now()}})
	took := time.Since(began)
	if err == nil || fc.stalled != 1 {
		t.Fatalf("collect against a silent server: %v (%d held); want an error", err, fc.stalled)
	}
	if took > 10*time.Second {
		t.Errorf("collect took %v against a silent server: want about one bound (%v)", took, bound)
	}
	res, err := b.store.Collect(ctx, []storage.ReleasedStep{{ID: stepID, ObservedAt: time.Now()}})
	if err != nil || res[storage.CollectCollected] != 1 {
		t.Fatalf("collect once the server answers: %v, %v; want it collected", res, err)
	}
}
