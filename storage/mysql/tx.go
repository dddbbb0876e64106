package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stepcollect/stepcollect/logkeys"
)

// maxConnRetries bounds the retries of a transaction whose connection broke.
const maxConnRetries = 3

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
	return s.retry(ctx, op, func(a *attempt) error { return s.tryTx(ctx, fn, a) })
}

// retry runs try until it succeeds, fails for a reason a retry cannot
// help, or has failed s.maxAttempts times; see inTx.
func (s *Storage) retry(ctx context.Context, op string, try func(a *attempt) error) error {
	a := &attempt{}
	connRetries := 0
	for {
		a.n++
		err := try(a)
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
