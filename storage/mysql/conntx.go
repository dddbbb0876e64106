package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
)

// A completion is the one transaction every result runs, and a database/sql
// transaction costs it five round trips: START TRANSACTION, the locking
// read, the delete, the outbox insert and COMMIT, each a write, a wake-up
// and a read on both sides. With multiStatements on (OpenDB's pools), a
// connTx sends START TRANSACTION with the locking read and COMMIT with the
// writes, in two round trips; the statements, their order and their locks
// are the same. Pools without it (WithDB) keep the database/sql path.

// connTx is a transaction a body runs by hand on one connection.
type connTx struct {
	conn  *sql.Conn
	begun bool // START TRANSACTION was sent: the connection is in the transaction until it ends
	ended bool // COMMIT answered OK, or the connection is gone with the transaction
}

type connTxBody func(ctx context.Context, ct *connTx, a *attempt) error

// inConnTx is inTx for a body that runs its own statements on a connTx.
func (s *Storage) inConnTx(ctx context.Context, op string, fn connTxBody) error {
	return s.retry(ctx, op, func(a *attempt) error { return s.tryConnTx(ctx, fn, a) })
}

func (s *Storage) tryConnTx(ctx context.Context, fn connTxBody, a *attempt) error {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("connection: %w", err)
	}
	ct := &connTx{conn: conn}
	defer ct.release()
	return fn(ctx, ct, a)
}

// release hands the connection back to the pool outside any transaction:
// one that did not commit is rolled back first, and a connection that
// cannot say it did is closed (the server rolls back what it held). A
// connection still inside a transaction must never reach the next caller.
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

// beginQuery starts the transaction and runs query in the same round trip,
// returning query's rows (and those of any statements after it, by
// NextResultSet).
func (ct *connTx) beginQuery(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	ct.begun = true
	return ct.conn.QueryContext(ctx, "START TRANSACTION; "+query, args...)
}

// execCommit runs stmts (statements joined by "; ") and COMMIT in one
// round trip and returns each statement's insert id, COMMIT's last.
// The server stops at the first statement that fails, so an error means
// COMMIT did not run, or ran and failed (a server error reply: rolled
// back), or, when no server error came back at all, that the answer was
// lost: a.ambiguousCommit is set, and the next try must settle by evidence
// whether this one committed.
func (ct *connTx) execCommit(ctx context.Context, a *attempt, stmts string, args ...any) ([]int64, error) {
	// The driver is called directly (for every statement's insert id), so
	// the arguments are converted here as database/sql would.
	named := make([]driver.NamedValue, len(args))
	for i, v := range args {
		dv, err := driver.DefaultParameterConverter.ConvertValue(v)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i+1, err)
		}
		named[i] = driver.NamedValue{Ordinal: i + 1, Value: dv}
	}
	var ids []int64
	err := ct.conn.Raw(func(dc any) error {
		ex, ok := dc.(driver.ExecerContext)
		if !ok {
			return errors.New("the driver connection cannot execute statements directly")
		}
		res, err := ex.ExecContext(ctx, stmts+"; COMMIT", named)
		if err != nil {
			return err
		}
		if r, ok := res.(mysql.Result); ok {
			ids = r.AllLastInsertIds()
		}
		return nil
	})
	if err == nil {
		ct.ended = true
		return ids, nil
	}
	if retryReason(err) == "connection" && mysqlErrNo(err) == 0 {
		a.ambiguousCommit = true
	}
	return nil, fmt.Errorf("commit: %w", err)
}

// supportsMultiStatements says whether db's connections take several
// statements with parameters in one call to the driver, as execCommit
// makes it: multiStatements=true and interpolateParams=true (without the
// latter the driver declines arguments, ErrSkip). An error means no.
func supportsMultiStatements(ctx context.Context, db *sql.DB) bool {
	conn, err := db.Conn(ctx)
	if err != nil {
		return false
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		ex, ok := dc.(driver.ExecerContext)
		if !ok {
			return errors.New("no ExecerContext")
		}
		_, err := ex.ExecContext(ctx, "DO ?; DO ?", []driver.NamedValue{{Ordinal: 1, Value: int64(1)}, {Ordinal: 2, Value: int64(2)}})
		return err
	}) == nil
}
