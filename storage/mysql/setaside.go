package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// setAsideable says whether err, which failed a scheduler transaction, is
// about a step's data (its event too large for the packet, or a value the
// server refused) rather than about the database: only then is setting
// the step aside the way past it.
func setAsideable(err error) bool {
	switch storage.ErrorCode(dataError(err)) {
	case storage.ETooLarge, storage.EInvalid:
		return true
	}
	return false
}

// narrow decides how a scheduler's claims of what ("due steps") go on
// after a batch of limit steps failed with err: an error that is not
// about a step's data ends them; a batch of several is run again one
// step at a time, to find the step; that step, failing alone, is set
// aside for events of eventType and the batches go back to full. It
// returns the next batch's limit, or the error to end with.
func (s *Storage) narrow(ctx context.Context, err error, what string, limit, full int, alone int64, eventType string) (int, error) {
	switch {
	case !setAsideable(err) || ctx.Err() != nil:
		// not a step's data, or the claims are over: end with err
	case limit > 1:
		return 1, nil // which step was it?
	case alone != 0:
		if err = s.setAside(ctx, alone, eventType, err); err == nil {
			return full, nil
		}
	}
	return 0, fmt.Errorf("retrieving %s: %w", what, err)
}

// setAside takes step stepID out of the scheduler's claims for events of
// eventType (step.due: its not_until; step.timed_out: its timeout), in a
// transaction of its own, and keeps what it cleared with the reason in
// stepcollect_set_aside. The step itself stays: its enrollments can still
// answer, time out (a due step) or be cancelled. Counted, and logged at
// ERROR with its id, for the operator (docs/runbook.md,
// StepcollectEventsSetAside).
//
// Clearing the time rather than marking the row keeps the claims' index
// ranges free of steps they must skip on every run, and changes nothing
// of NanoCMD's schema; no placeholder event is written, because an event
// without its commands or results is one the workflow engine cannot act on.
func (s *Storage) setAside(ctx context.Context, stepID int64, eventType string, cause error) error {
	// One line of valid UTF-8 that fits its column: a reason the server
	// refused would hold the step back after all.
	reason := errorText(strings.Join(strings.Fields(cause.Error()), " "))
	found := false
	err := s.inTx(ctx, storage.OpSetAside, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
		found = false
		var notUntil, timeout sql.NullTime
		err := tx.QueryRowContext(ctx, qLockStepTimes, stepID).Scan(&notUntil, &timeout)
		if errors.Is(err, sql.ErrNoRows) {
			return nil // collected or cancelled meanwhile: nothing left to hold back
		} else if err != nil {
			return err
		}
		found = true
		was, clear := notUntil, expand(qClearNotUntil, 1)
		if eventType == events.StepTimedOut {
			was, clear = timeout, qClearTimeout
		}
		if _, err := tx.ExecContext(ctx, clear, stepID); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, qRecordSetAside, stepID, eventType, was, reason)
		return err
	})
	if err != nil {
		return fmt.Errorf("setting aside step %d (%s): %w (set aside because: %v)", stepID, eventType, err, cause)
	}
	if !found {
		return nil
	}
	s.observer.EventSetAside(eventType)
	s.logger.Error().Int64(logkeys.StepID, stepID).Str(logkeys.EventType, eventType).Err(cause).
		Msg("step set aside: its event cannot be written; the steps behind it go on")
	return nil
}
