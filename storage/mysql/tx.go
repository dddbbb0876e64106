package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
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
	// byProgress bounds the try by the time between its statements, not
	// by its whole length (storing a step: see tryWithin); progress, set
	// for such a try, is called after each statement that succeeded.
	byProgress bool
	progress   func()
}

// madeProgress tells a try bounded by progress that a statement succeeded.
func (a *attempt) madeProgress() {
	if a.progress != nil {
		a.progress()
	}
}

type txBody func(ctx context.Context, tx *sql.Tx, a *attempt) error

// inTx runs fn in a transaction, retrying the whole transaction on deadlock,
// lock wait timeout and broken connections, up to s.maxAttempts, with
// jittered exponential backoff. op names the operation in errors and metrics.
func (s *Storage) inTx(ctx context.Context, op string, fn txBody) error {
	return s.retry(ctx, op, func(ctx context.Context, a *attempt) error { return s.tryTx(ctx, fn, a) })
}

// errAttemptTimedOut is the cause of a try's context when the try took
// longer than s.attemptTimeout (WithAttemptTimeout).
var errAttemptTimedOut = errors.New("the try took longer than its bound (the server or the network to it went silent)")

// retry runs try until it succeeds, fails for a reason a retry cannot
// help, or has failed s.maxAttempts times; see inTx.
func (s *Storage) retry(ctx context.Context, op string, try func(ctx context.Context, a *attempt) error) error {
	// A step's rows are written in statements of a bounded size, as many
	// as its ids x commands take: a step at the default limits (1,000,000
	// rows) takes longer than -mysql-try-timeout as a whole, and was
	// refused with a 503 blaming the server. Its bound is on each
	// statement instead.
	a := &attempt{byProgress: op == storage.OpStoreStep}
	err := s.retryTries(ctx, op, a, try)
	if err != nil && a.ambiguousCommit && storage.ErrorCode(err) == "" && !errors.Is(err, storage.ErrCommitUnknown) {
		// A try's COMMIT went unanswered and no later try could settle
		// whether it went through (the server stayed out of reach): the
		// caller must not take this for "nothing was written".
		return fmt.Errorf("%w: %w", storage.ErrCommitUnknown, err)
	}
	return err
}

// retryTries is retry's loop of tries.
func (s *Storage) retryTries(ctx context.Context, op string, a *attempt, try func(ctx context.Context, a *attempt) error) error {
	connRetries := 0
	bounded := s.results != nil && (op == storage.OpStoreResult || op == storage.OpStoreNotNow)
	for {
		a.n++
		var err error
		if bounded {
			err = s.asResult(ctx, op, func() error { return s.tryWithin(ctx, a, try) })
		} else {
			err = s.tryWithin(ctx, a, try)
		}
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

// asResult runs try as one of the results in a transaction at once
// (WithMaxActiveResults), once its turn comes. The turn is for one try:
// a try that failed waits out its backoff without it.
func (s *Storage) asResult(ctx context.Context, op string, try func() error) error {
	select {
	case s.results <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("%s: waiting for a turn among the %d results in a transaction at once: %w", op, cap(s.results), ctx.Err())
	}
	defer func() { <-s.results }()
	for n := int64(len(s.results)); ; {
		peak := s.resultsPeak.Load()
		if n <= peak || s.resultsPeak.CompareAndSwap(peak, n) {
			break
		}
	}
	return try()
}

// tryWithin runs one try under s.attemptTimeout. A try cut off by it
// (not by the caller) is a broken connection to retry: go-sql-driver
// closed the connection when the context ended, and the server rolls back
// whatever the try held.
//
// A try with a.byProgress is cut off only when s.attemptTimeout passes
// without a statement of it succeeding (a.madeProgress), however long it
// takes in all: a silent server is found as soon, and a long transaction
// that keeps going is not taken for one.
func (s *Storage) tryWithin(ctx context.Context, a *attempt, try func(ctx context.Context, a *attempt) error) error {
	if s.attemptTimeout <= 0 {
		return try(ctx, a)
	}
	if a.byProgress {
		actx, cancel := context.WithCancelCause(ctx)
		defer cancel(nil)
		watchdog := time.AfterFunc(s.attemptTimeout, func() { cancel(errAttemptTimedOut) })
		defer watchdog.Stop()
		a.progress = func() { watchdog.Reset(s.attemptTimeout) }
		defer func() { a.progress = nil }()
		err := try(actx, a)
		if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errAttemptTimedOut) {
			return fmt.Errorf("%w: %v passed without a statement done: %w", errAttemptTimedOut, s.attemptTimeout, err)
		}
		return err
	}
	actx, cancel := context.WithTimeoutCause(ctx, s.attemptTimeout, errAttemptTimedOut)
	defer cancel()
	err := try(actx, a)
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errAttemptTimedOut) {
		return fmt.Errorf("%w after %v: %w", errAttemptTimedOut, s.attemptTimeout, err)
	}
	return err
}

// bounded is ctx bounded by s.attemptTimeout, for a statement run outside
// a transaction on the paths that must not wait on a silent server (the
// webhook's lookups, collection's reference check, the worker's outbox
// and sweep statements): past the bound go-sql-driver closes the
// connection and the statement fails, as on a broken one.
func (s *Storage) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.attemptTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeoutCause(ctx, s.attemptTimeout, errAttemptTimedOut)
}

// commitUnanswered says whether COMMIT's error err means it may have
// gone through: no server error reply came back, because the connection
// broke or the try's context ended while COMMIT was on its way (a COMMIT
// never sent is then taken as maybe committed too: the next try's
// evidence says it was not).
func commitUnanswered(ctx context.Context, err error) bool {
	return mysqlErrNo(err) == 0 && (retryReason(err) == "connection" || ctx.Err() != nil)
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
		if commitUnanswered(ctx, err) {
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
