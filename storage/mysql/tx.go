package mysql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// maxConnRetries bounds the retries of a transaction whose connection broke.
const maxConnRetries = 3

// MySQL/MariaDB error numbers the storage acts on.
const (
	errDupEntry        = 1062
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
	errServerShutdown  = 1053
	errConnKilled      = 1927 // MariaDB: "Connection was killed"
	errQueryKilled     = 1317 // the statement was interrupted by KILL
)

// attempt tells a transaction body which try it is. ambiguousCommit is set
// when an earlier try's COMMIT was sent and no answer came back: that try
// may have committed. A body must then settle the question by evidence in
// the database (a row only that try could have written), never by
// inference from rows being gone: a cancel or a timeout deletes them too.
//
// Every body starts from empty state: what a rolled-back try computed is
// not carried into the next one, except as the question to check.
type attempt struct {
	n               int
	ambiguousCommit bool
}

type txBody func(ctx context.Context, tx *sql.Tx, a *attempt) error

// inTx runs fn in a transaction, retrying the whole transaction on deadlock,
// lock wait timeout and broken connections, up to s.maxAttempts, with
// jittered exponential backoff. op names the operation in errors and metrics.
func (s *Storage) inTx(ctx context.Context, op string, fn txBody) error {
	a := &attempt{}
	connRetries := 0
	for {
		a.n++
		err := s.tryTx(ctx, fn, a)
		if err == nil {
			return nil
		}
		reason := retryReason(err)
		if reason == "" || ctx.Err() != nil {
			return err
		}
		if a.n >= s.maxAttempts {
			return fmt.Errorf("%s: gave up after %d attempts: %w", op, a.n, err)
		}
		// A fresh connection is what a broken one needs, and the first
		// retry gets one; more only hold the caller (a server that keeps
		// dropping connections, or a read-only one with
		// rejectReadOnly=true, is not coming back in milliseconds).
		if reason == "connection" {
			if connRetries++; connRetries > maxConnRetries {
				return fmt.Errorf("%s: gave up after %d broken connections (the server is down, restarting, or read-only with rejectReadOnly=true): %w", op, connRetries, err)
			}
		}
		s.observer.TxRetried(op, reason)
		s.logger.Debug().Str(logkeys.Op, op).Int(logkeys.Attempt, a.n).
			Str(logkeys.Reason, reason).Err(err).Msg("retrying transaction")
		if ctxErr := sleepCtx(ctx, s.backoff(a.n)); ctxErr != nil {
			return fmt.Errorf("%s: %w (while waiting to retry after: %v)", op, ctxErr, err)
		}
	}
}

func (s *Storage) tryTx(ctx context.Context, fn txBody, a *attempt) error {
	tx, err := s.db.BeginTx(ctx, s.txOpts)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err = fn(ctx, tx, a); err != nil {
		if rbErr := tx.Rollback(); rbErr != nil && !errors.Is(rbErr, sql.ErrTxDone) && retryReason(err) == "" {
			return fmt.Errorf("rollback: %v; while handling: %w", rbErr, err)
		}
		return err
	}
	if err = tx.Commit(); err != nil {
		// A server error reply to COMMIT (1053 shutdown, 1927 and 1317
		// killed) means the server answered: the transaction was rolled
		// back. Only a COMMIT with no answer at all (the connection broke)
		// may have gone through.
		if retryReason(err) == "connection" && mysqlErrNo(err) == 0 {
			a.ambiguousCommit = true
		}
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// retryReason says whether err is worth running the transaction again for,
// and why: "deadlock", "lock_wait_timeout", "connection", or "" for no.
func retryReason(err error) string {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case errDeadlock:
			return "deadlock"
		case errLockWaitTimeout:
			return "lock_wait_timeout"
		case errConnKilled, errServerShutdown, errQueryKilled:
			return "connection"
		}
		return ""
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) || errors.Is(err, sql.ErrConnDone) {
		return "connection"
	}
	return ""
}

// Server errors that say a value was refused: the input is at fault, and
// no retry (and no "storage unavailable") will change that.
var dataErrors = map[uint16]bool{
	1048: true, // column cannot be null
	1264: true, // out of range value
	1265: true, // data truncated
	1292: true, // incorrect datetime (or other) value
	1366: true, // incorrect string value
	1367: true, // illegal value
	1406: true, // data too long for column
	1690: true, // value out of range
}

const errPacketTooLarge = 1153

// dataError turns a refused value into the domain error the caller maps to
// a 4xx, keeping the server's one-line reason; other errors pass through.
func dataError(err error) error {
	var me *mysql.MySQLError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mysql.ErrPktTooLarge), errors.As(err, &me) && me.Number == errPacketTooLarge:
		return storage.Errorf(storage.ETooLarge, "the statement is larger than the server's max_allowed_packet: %v", err)
	case errors.As(err, &me) && dataErrors[me.Number]:
		return storage.Errorf(storage.EInvalid, "value refused by the database: %s", me.Message)
	}
	return err
}

// backoff is full jitter over an exponential ceiling: spreading retries is
// what keeps a herd of deadlock victims from meeting again.
func (s *Storage) backoff(n int) time.Duration {
	d := s.backoffBase << min(n-1, 16)
	if d <= 0 || d > s.backoffMax {
		d = s.backoffMax
	}
	return d/4 + rand.N(d-d/4+1)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// mysqlErrNo returns the server error number in err's chain, or 0.
func mysqlErrNo(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// maxInList bounds the items of one IN list: one statement stays far below
// the 65535-placeholder limit and one transaction's binlog stays small.
const maxInList = 1000

// expand writes out the list placeholders of q: each "IN (?)" becomes n
// placeholders and each "IN ((?, ?))" n pairs, in the order they appear and
// of the sizes given.
func expand(q string, sizes ...int) string {
	var b strings.Builder
	for _, n := range sizes {
		i := strings.Index(q, "IN (")
		if i < 0 {
			panic("expand: fewer lists than sizes in " + q)
		}
		b.WriteString(q[:i+3])
		q = q[i+3:]
		switch {
		case strings.HasPrefix(q, "((?, ?))"):
			b.WriteString("(" + strings.TrimSuffix(strings.Repeat("(?, ?), ", n), ", ") + ")")
			q = q[len("((?, ?))"):]
		case strings.HasPrefix(q, "(?)"):
			b.WriteString("(" + strings.TrimSuffix(strings.Repeat("?, ", n), ", ") + ")")
			q = q[len("(?)"):]
		default:
			panic("expand: unknown list form in " + q)
		}
	}
	b.WriteString(q)
	return b.String()
}

// chunks calls fn with consecutive pieces of xs of at most size items.
func chunks[T any](xs []T, size int, fn func([]T) error) error {
	for len(xs) > 0 {
		n := min(len(xs), size)
		if err := fn(xs[:n]); err != nil {
			return err
		}
		xs = xs[n:]
	}
	return nil
}

// args converts a slice to []any for a statement, after any leading args.
func args[T any](xs []T, lead ...any) []any {
	out := make([]any, 0, len(lead)+len(xs))
	out = append(out, lead...)
	for _, x := range xs {
		out = append(out, x)
	}
	return out
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

func nullTime(t time.Time) sql.NullTime { return sql.NullTime{Time: t, Valid: !t.IsZero()} }

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// queryInt64s runs a query whose rows are one integer column.
func queryInt64s(ctx context.Context, q querier, query string, args ...any) ([]int64, error) {
	return queryList(ctx, q, query, args, func(rs *sql.Rows) (int64, error) {
		var v int64
		return v, rs.Scan(&v)
	})
}

// queryStrings runs a query whose rows are one string column.
func queryStrings(ctx context.Context, q querier, query string, args ...any) ([]string, error) {
	return queryList(ctx, q, query, args, func(rs *sql.Rows) (string, error) {
		var v string
		return v, rs.Scan(&v)
	})
}

// queryList runs query and scans every row with scan.
func queryList[T any](ctx context.Context, q querier, query string, args []any, scan func(*sql.Rows) (T, error)) ([]T, error) {
	rs, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rs.Close()
	var out []T
	for rs.Next() {
		v, err := scan(rs)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rs.Err()
}
