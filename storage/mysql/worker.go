package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/storage"
)

// Worker batches: each is one short transaction that claims its steps with
// SKIP LOCKED, so any number of workers may run these at once and none waits
// on another; a call loops over batches until nothing is left.
const (
	dueStepsPerBatch      = 100
	timedOutStepsPerBatch = 50
	rePushRowsPerBatch    = 1000
)

// RetrieveStepsToEnqueue returns the steps whose NotUntil is before
// pushTime, with their raw commands and enrollment ids, and marks them sent
// (their raw commands are dropped and their commands' last push is
// pushTime). A sent step keeps its timeout.
func (s *Storage) RetrieveStepsToEnqueue(ctx context.Context, pushTime time.Time) ([]*nanostorage.StepEnqueueing, error) {
	if pushTime.IsZero() {
		return nil, fmt.Errorf("retrieving due steps: empty push time")
	}
	return dueSteps(ctx, s, pushTime, func(_ context.Context, _ *sql.Tx, _ int64, se *nanostorage.StepEnqueueing) (*nanostorage.StepEnqueueing, error) {
		return se, nil
	})
}

// SendDueSteps writes a step.due event to the outbox for every step whose
// NotUntil is before now, in the transaction that marks it sent, and
// returns how many. The service's replacement for RetrieveStepsToEnqueue:
// the workflow engine learns of due steps through the outbox.
func (s *Storage) SendDueSteps(ctx context.Context, now time.Time) (int, error) {
	if err := scheduleOwnedElsewhere(ctx, s.db); err != nil {
		return 0, err
	}
	salt, err := s.eventSalt(ctx)
	if err != nil {
		return 0, fmt.Errorf("sending due steps: %w", err)
	}
	refs, err := dueSteps(ctx, s, now, func(ctx context.Context, tx *sql.Tx, stepID int64, se *nanostorage.StepEnqueueing) (storage.OutboxRef, error) {
		if err := scheduleOwnedElsewhere(ctx, tx); err != nil {
			return storage.OutboxRef{}, err
		}
		return s.insertEvent(ctx, tx, events.Due(salt, stepID, se, now), "")
	})
	return len(refs), err
}

// dueStepFn receives, inside the transaction that marks it sent, each due
// step that still has enrollments to send to, and returns what the caller
// collects of it.
type dueStepFn[T any] func(ctx context.Context, tx *sql.Tx, stepID int64, se *nanostorage.StepEnqueueing) (T, error)

// dueSteps claims due steps in batches and hands each to emit. It returns
// what emit returned for the batches that committed: a batch whose
// transaction is retried starts again from nothing, so a rolled-back try
// never shows up twice (or at all).
//
// A step whose event cannot be written is set aside (see setAside), and
// the steps behind it go on: a batch that fails for a step's data is run
// again one step at a time, and the step that fails alone is the one.
func dueSteps[T any](ctx context.Context, s *Storage, pushTime time.Time, emit dueStepFn[T]) ([]T, error) {
	var out []T
	limit := dueStepsPerBatch
	for {
		claimed := 0
		var batch []T
		var alone int64 // the one step claimed, in a batch of one
		err := s.inTx(ctx, storage.OpDueSteps, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			claimed, batch, alone = 0, nil, 0
			type dueRow struct {
				id int64
				se *nanostorage.StepEnqueueing
			}
			rows, err := queryList(ctx, tx, qClaimDueSteps, []any{dbTime(pushTime), limit}, func(rs *sql.Rows) (dueRow, error) {
				r := dueRow{se: &nanostorage.StepEnqueueing{}}
				var name sql.NullString
				err := rs.Scan(&r.id, &r.se.WorkflowName, &r.se.InstanceID, &name, &r.se.Context)
				r.se.Name = name.String
				return r, err
			})
			if err != nil {
				return fmt.Errorf("claiming due steps: %w", err)
			}
			claimed = len(rows)
			if claimed == 0 {
				return nil
			}
			if limit == 1 {
				alone = rows[0].id
			}
			byID := make(map[int64]*nanostorage.StepEnqueueing, len(rows))
			stepIDs := make([]int64, len(rows))
			for i, r := range rows {
				byID[r.id], stepIDs[i] = r.se, r.id
			}
			_, err = queryList(ctx, tx, expand(qGetStepCommands, len(stepIDs)), args(stepIDs), func(rs *sql.Rows) (struct{}, error) {
				var id int64
				var c nanostorage.StepCommandRaw
				err := rs.Scan(&id, &c.CommandUUID, &c.RequestType, &c.Command)
				byID[id].Commands = append(byID[id].Commands, c)
				return struct{}{}, err
			})
			if err != nil {
				return fmt.Errorf("reading raw commands of steps %v: %w", stepIDs, err)
			}
			_, err = queryList(ctx, tx, expand(qGetStepEnrollments, len(stepIDs)), args(stepIDs), func(rs *sql.Rows) (struct{}, error) {
				var id int64
				var enrollment string
				err := rs.Scan(&id, &enrollment)
				byID[id].IDs = append(byID[id].IDs, enrollment)
				return struct{}{}, err
			})
			if err != nil {
				return fmt.Errorf("reading enrollments of steps %v: %w", stepIDs, err)
			}
			if _, err := tx.ExecContext(ctx, expand(qDeleteStepCommands, len(stepIDs)), args(stepIDs)...); err != nil {
				return fmt.Errorf("dropping raw commands of steps %v: %w", stepIDs, err)
			}
			if _, err := tx.ExecContext(ctx, expand(qMarkStepsPushed, len(stepIDs)), args(stepIDs, pushTime)...); err != nil {
				return fmt.Errorf("marking steps %v pushed: %w", stepIDs, err)
			}
			if _, err := tx.ExecContext(ctx, expand(qClearNotUntil, len(stepIDs)), args(stepIDs)...); err != nil {
				return fmt.Errorf("marking steps %v sent: %w", stepIDs, err)
			}
			for _, r := range rows {
				// A step whose enrollments all answered or were cancelled
				// before it was due has nobody to send to.
				if len(r.se.IDs) == 0 {
					continue
				}
				v, err := emit(ctx, tx, r.id, r.se)
				if err != nil {
					return err
				}
				batch = append(batch, v)
			}
			return nil
		})
		if err != nil {
			if limit, err = s.narrow(ctx, err, "due steps", limit, dueStepsPerBatch, alone, events.StepDue); err != nil {
				return out, err
			}
			continue
		}
		out = append(out, batch...)
		if claimed < limit {
			return out, nil
		}
	}
}

// RetrieveTimedOutSteps returns, one per step and enrollment, the steps
// whose timeout has passed with that enrollment not done, with its commands
// as they stood, and deletes them. An enrollment's rows are locked in the
// same order completion locks them, so a result racing the timeout either
// completes first (and is not reported as timed out) or finds its command
// gone.
func (s *Storage) RetrieveTimedOutSteps(ctx context.Context) ([]*nanostorage.StepResult, error) {
	return timedOutSteps(ctx, s, time.Now(), func(_ context.Context, _ *sql.Tx, _ int64, r *nanostorage.StepResult) (*nanostorage.StepResult, error) {
		return r, nil
	})
}

// TimeOutSteps writes a step.timed_out event to the outbox for every
// enrollment of every step whose timeout passed, in the transaction that
// deletes it, and returns how many. The service's replacement for
// RetrieveTimedOutSteps.
func (s *Storage) TimeOutSteps(ctx context.Context, now time.Time) (int, error) {
	if err := scheduleOwnedElsewhere(ctx, s.db); err != nil {
		return 0, err
	}
	salt, err := s.eventSalt(ctx)
	if err != nil {
		return 0, fmt.Errorf("timing out steps: %w", err)
	}
	refs, err := timedOutSteps(ctx, s, now, func(ctx context.Context, tx *sql.Tx, stepID int64, r *nanostorage.StepResult) (storage.OutboxRef, error) {
		if err := scheduleOwnedElsewhere(ctx, tx); err != nil {
			return storage.OutboxRef{}, err
		}
		return s.insertEvent(ctx, tx, events.FromStepResult(salt, events.StepTimedOut, stepID, r, now), r.IDs[0])
	})
	return len(refs), err
}

// timedOutFn receives, inside the transaction that deletes it, each
// enrollment's part of a timed-out step, and returns what the caller
// collects of it.
type timedOutFn[T any] func(ctx context.Context, tx *sql.Tx, stepID int64, r *nanostorage.StepResult) (T, error)

// One timeout transaction handles at most this many enrollments, and stops
// early once the results it holds pass this many bytes: a step fanned out
// to 100,000 enrollments times out over many short transactions, each
// bounded in locks, in memory and in binlog, instead of one huge one.
const (
	timedOutIDsPerTx   = 1000
	timedOutIDsPerRead = 100
	timedOutBytesPerTx = 64 << 20
)

// timedOutSteps claims timed-out steps in batches and hands each
// enrollment's result to emit. Like dueSteps, it returns what emit returned
// for the transactions that committed, and nothing of a rolled-back try.
//
// A step whose event cannot be written is set aside, as in dueSteps.
func timedOutSteps[T any](ctx context.Context, s *Storage, now time.Time, emit timedOutFn[T]) ([]T, error) {
	var out []T
	limit := timedOutStepsPerBatch
	for {
		more := false
		var batch []T
		var alone int64 // the one step claimed, in a batch of one
		err := s.inTx(ctx, storage.OpTimeOutSteps, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			more, batch, alone = false, nil, 0
			type stepRow struct {
				id  int64
				ctx nanostorage.StepContext
			}
			steps, err := queryList(ctx, tx, qClaimTimedOutSteps, []any{dbTime(now), limit}, func(rs *sql.Rows) (stepRow, error) {
				var r stepRow
				var name sql.NullString
				err := rs.Scan(&r.id, &r.ctx.WorkflowName, &r.ctx.InstanceID, &name, &r.ctx.Context)
				r.ctx.Name = name.String
				return r, err
			})
			if err != nil {
				return fmt.Errorf("claiming timed-out steps: %w", err)
			}
			more = len(steps) == limit
			if limit == 1 && len(steps) == 1 {
				alone = steps[0].id
			}
			budget := timeOutBudget{ids: timedOutIDsPerTx, bytes: timedOutBytesPerTx}
			var finished []int64
			for _, st := range steps {
				results, done, err := s.timeOutStep(ctx, tx, st.id, st.ctx, &budget)
				if err != nil {
					return err
				}
				for _, r := range results {
					v, err := emit(ctx, tx, st.id, r)
					if err != nil {
						return err
					}
					batch = append(batch, v)
				}
				if !done {
					more = true // the rest of this step in the next transaction
					break
				}
				finished = append(finished, st.id)
			}
			if len(finished) == 0 {
				return nil
			}
			if _, err := tx.ExecContext(ctx, expand(qDeleteStepCommands, len(finished)), args(finished)...); err != nil {
				return fmt.Errorf("deleting raw commands of timed-out steps %v: %w", finished, err)
			}
			if _, err := tx.ExecContext(ctx, expand(qDeleteSteps, len(finished)), args(finished)...); err != nil {
				return fmt.Errorf("deleting timed-out steps %v: %w", finished, err)
			}
			return nil
		})
		if err != nil {
			if limit, err = s.narrow(ctx, err, "timed-out steps", limit, timedOutStepsPerBatch, alone, events.StepTimedOut); err != nil {
				return out, err
			}
			continue
		}
		out = append(out, batch...)
		if !more {
			return out, nil
		}
	}
}

// timeOutBudget is what one timeout transaction may still take on.
type timeOutBudget struct {
	ids   int
	bytes int
}

func (b *timeOutBudget) spent() bool { return b.ids <= 0 || b.bytes <= 0 }

// timeOutStep locks and deletes what is left of one claimed step's
// enrollment rows, within budget, returning one result per enrollment and
// whether the step has no enrollment rows left (so it can be deleted).
// Rows cannot be added to an existing step, so a listing that came back
// short of the budget saw all of them.
func (s *Storage) timeOutStep(ctx context.Context, tx *sql.Tx, stepID int64, sc nanostorage.StepContext, budget *timeOutBudget) ([]*nanostorage.StepResult, bool, error) {
	if budget.spent() {
		return nil, false, nil
	}
	enrollments, err := queryStrings(ctx, tx, qGetStepEnrollmentIDs, stepID, budget.ids+1)
	if err != nil {
		return nil, false, fmt.Errorf("reading enrollments of timed-out step %d: %w", stepID, err)
	}
	done := len(enrollments) <= budget.ids
	var out []*nanostorage.StepResult
	for len(enrollments) > 0 && !budget.spent() {
		c := enrollments[:min(len(enrollments), timedOutIDsPerRead, budget.ids)]
		enrollments = enrollments[len(c):]
		byID := map[string]*nanostorage.StepResult{}
		_, err := queryList(ctx, tx, expand(qLockTimedOutRows, len(c)), append(args(c), stepID), func(rs *sql.Rows) (struct{}, error) {
			var id string
			var r nanostorage.StepCommandResult
			if err := rs.Scan(&id, &r.CommandUUID, &r.RequestType, &r.Completed, &r.ResultReport); err != nil {
				return struct{}{}, err
			}
			sr := byID[id]
			if sr == nil {
				sr = &nanostorage.StepResult{StepContext: sc, IDs: []string{id}}
				byID[id] = sr
				out = append(out, sr)
			}
			sr.Commands = append(sr.Commands, r)
			budget.bytes -= len(r.ResultReport)
			return struct{}{}, nil
		})
		if err != nil {
			return nil, false, fmt.Errorf("locking rows of timed-out step %d: %w", stepID, err)
		}
		if _, err := tx.ExecContext(ctx, expand(qDeleteTimedOutRows, len(c)), append(args(c), stepID)...); err != nil {
			return nil, false, fmt.Errorf("deleting rows of timed-out step %d: %w", stepID, err)
		}
		budget.ids -= len(c)
	}
	return out, done && len(enrollments) == 0, nil
}
