package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"time"
)

// A completion is the one transaction every result runs, and a database/sql
// transaction costs it five round trips: START TRANSACTION, the locking
// read, the delete, the outbox insert and COMMIT, each a write, a wake-up
// and a read on both sides (a third of the api's CPU went to those
// syscalls). With multiStatements on (OpenDB's pools) a connTx sends START
// TRANSACTION with the locking read, and the writes with COMMIT: two round
// trips, with the same statements in the same order taking the same locks.
// Pools without it (WithDB), or with an isolation level set per
// transaction (WithIsolation), keep database/sql's transaction.

// txn is what a completion's body needs of its transaction: reads, which
// run at once, and writes, whose results it never reads and which a connTx
// holds back to send with its COMMIT. Every read of a body comes before
// its first write.
type txn interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	// write runs (or queues) one statement; what names it in errors.
	write(ctx context.Context, what, query string, args ...any) error
}

// sqlTxn is a database/sql transaction as a txn: writes run at once.
type sqlTxn struct{ *sql.Tx }

func (t sqlTxn) write(ctx context.Context, what, query string, args ...any) error {
	if _, err := t.ExecContext(ctx, query, args...); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// connTx is a transaction run by hand on one connection, in two round
// trips (see above).
type connTx struct {
	conn  *sql.Conn
	begun bool // START TRANSACTION was sent: the session is in the transaction until it ends
	ended bool // COMMIT answered OK

	// the writes queued for COMMIT, in order
	stmts []string
	whats []string
	args  []any
}

// inConnTx is inTx for a body that runs on a connTx: the same retries,
// the same attempt, each try on a connection of its own.
func (s *Storage) inConnTx(ctx context.Context, op string, fn func(context.Context, txn, *attempt) error) error {
	return s.retry(ctx, op, func(ctx context.Context, a *attempt) error { return s.tryConnTx(ctx, fn, a) })
}

func (s *Storage) tryConnTx(ctx context.Context, fn func(context.Context, txn, *attempt) error, a *attempt) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	ct := &connTx{conn: conn}
	defer ct.release()
	if err := fn(ctx, ct, a); err != nil {
		return err
	}
	return ct.commit(ctx, a)
}

// begin prefixes the transaction's first statement with START TRANSACTION.
// go-sql-driver skips the result of START TRANSACTION (it has no columns),
// so the rows are those of query, and an error is query's.
func (ct *connTx) begin(query string) string {
	if ct.begun {
		return query
	}
	ct.begun = true
	return "START TRANSACTION; " + query
}

func (ct *connTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return ct.conn.QueryContext(ctx, ct.begin(query), args...)
}

func (ct *connTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return ct.conn.QueryRowContext(ctx, ct.begin(query), args...)
}

func (ct *connTx) write(_ context.Context, what, query string, args ...any) error {
	ct.stmts = append(ct.stmts, query)
	ct.whats = append(ct.whats, what)
	ct.args = append(ct.args, args...)
	return nil
}

// commit sends the queued writes and COMMIT in one round trip. The server
// stops at the first statement that fails, so an error means COMMIT did
// not run, or ran and was refused (a server error reply: rolled back), or,
// when no server error came back at all, that the answer was lost:
// a.ambiguousCommit is set, and the next try settles by evidence whether
// this one committed.
func (ct *connTx) commit(ctx context.Context, a *attempt) error {
	if ct.ended {
		return nil // committed in one round trip (onetrip.go)
	}
	q := ct.begin(strings.Join(append(ct.stmts, "COMMIT"), "; "))
	if _, err := ct.conn.ExecContext(ctx, q, ct.args...); err != nil {
		if commitUnanswered(ctx, err) {
			a.ambiguousCommit = true
		}
		if len(ct.whats) == 0 {
			return fmt.Errorf("commit: %w", err)
		}
		return fmt.Errorf("%s, then commit: %w", strings.Join(ct.whats, ", "), err)
	}
	ct.ended = true
	return nil
}

// release hands the connection back to the pool outside any transaction:
// one that did not commit is rolled back first, and a connection that
// cannot say it did is closed (the server rolls back what it held). A
// connection still inside a transaction must never reach the next caller:
// its START TRANSACTION would commit this one's writes.
func (ct *connTx) release() {
	if ct.begun && !ct.ended {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := ct.conn.ExecContext(ctx, "ROLLBACK")
		cancel()
		if err != nil {
			ct.conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}
	ct.conn.Close()
}

// supportsMultiStatements says whether db's connections take several
// statements with parameters in one query, as a connTx sends them:
// multiStatements=true and interpolateParams=true (without the latter the
// driver prepares the statement, and a prepared statement is one). An
// error means no.
func supportsMultiStatements(ctx context.Context, db *sql.DB) bool {
	var a, b int
	return db.QueryRowContext(ctx, "DO ?; SELECT ?, ?", 0, 1, 2).Scan(&a, &b) == nil && a == 1 && b == 2
}
