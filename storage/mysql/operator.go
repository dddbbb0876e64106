package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/stepcollect/stepcollect/storage"
)

// MaxPage is the most rows one operator listing returns.
const MaxPage = 1000

// ListSteps returns the steps that still exist, oldest first, filtered and
// paged by f, and whether more follow the last one.
func (s *Storage) ListSteps(ctx context.Context, f storage.StepFilter) ([]storage.StepSummary, bool, error) {
	if f.Limit < 1 || f.Limit > MaxPage {
		return nil, false, storage.Errorf(storage.EInvalid, "limit: %d is not between 1 and %d", f.Limit, MaxPage)
	}
	if !s.holds(ctx, f.WorkflowName, f.InstanceID) {
		return nil, false, nil
	}
	var q strings.Builder
	q.WriteString(qListSteps)
	var a []any
	switch {
	case f.After == nil:
	case f.After.CreatedAt == nil:
		q.WriteString(qListStepsAfterNoTime)
		a = append(a, f.After.ID)
	default:
		t := dbTime(*f.After.CreatedAt)
		q.WriteString(qListStepsAfter)
		a = append(a, t, t, f.After.ID)
	}
	if f.WorkflowName != "" {
		q.WriteString(qListStepsWorkflow)
		a = append(a, f.WorkflowName)
	}
	if f.InstanceID != "" {
		q.WriteString(qListStepsInstance)
		a = append(a, f.InstanceID)
	}
	if f.OlderThan > 0 {
		q.WriteString(qListStepsOlderThan)
		a = append(a, f.OlderThan.Microseconds())
	}
	q.WriteString(qListStepsOrderLimit)
	a = append(a, f.Limit+1) // one more says whether a next page exists
	out, err := queryList(ctx, s.db, q.String(), a, func(rs *sql.Rows) (storage.StepSummary, error) {
		var st storage.StepSummary
		var name sql.NullString
		var created, notUntil, timeout sql.NullTime
		var ids sql.NullInt64
		err := rs.Scan(&st.StepID, &st.WorkflowName, &st.InstanceID, &name, &created, &notUntil, &timeout, &ids, &st.OutstandingIDs)
		st.StepName = name.String
		if created.Valid {
			st.CreatedAt = &created.Time
		}
		if notUntil.Valid {
			st.NotUntil = &notUntil.Time
		}
		if timeout.Valid {
			st.Timeout = &timeout.Time
		}
		if ids.Valid {
			n := int(ids.Int64)
			st.IDs = &n
		}
		return st, err
	})
	if err != nil {
		return nil, false, fmt.Errorf("listing steps (workflow %q, instance %q): %w", f.WorkflowName, f.InstanceID, err)
	}
	if len(out) > f.Limit {
		return out[:f.Limit], true, nil
	}
	return out, false, nil
}

// StepOutstanding returns, in order after the enrollment id after, up to
// limit enrollments that have not finished step stepID, and whether more
// follow. A step that does not exist is an error wrapping
// storage.ErrStepNotFound.
func (s *Storage) StepOutstanding(ctx context.Context, stepID int64, after string, limit int) ([]string, bool, error) {
	if limit < 1 || limit > MaxPage {
		return nil, false, storage.Errorf(storage.EInvalid, "limit: %d is not between 1 and %d", limit, MaxPage)
	}
	if err := s.stepExists(ctx, stepID); err != nil {
		return nil, false, err
	}
	ids, err := queryStrings(ctx, s.db, qStepOutstandingAfter, stepID, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("outstanding enrollments of step %d: %w", stepID, err)
	}
	if len(ids) > limit {
		return ids[:limit], true, nil
	}
	return ids, false, nil
}

func (s *Storage) stepExists(ctx context.Context, stepID int64) error {
	var one int
	err := s.db.QueryRowContext(ctx, qStepExists, stepID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("step %d: %w", stepID, storage.ErrStepNotFound)
	} else if err != nil {
		return fmt.Errorf("reading step %d: %w", stepID, err)
	}
	return nil
}

// Cancelling a step for many enrollments takes one transaction per
// cancelIDsPerTx of them, locking cancelIDsPerLock at a time: a step sent to
// 100,000 enrollments is cancelled in 100 short transactions, each bounded
// in locks and binlog, never one huge one.
const (
	cancelIDsPerTx   = 1000
	cancelIDsPerLock = 100
)

// CancelStep cancels step stepID for every enrollment that still holds it
// and returns how many did. Each enrollment's rows go in one transaction
// (several enrollments to one), locked in the order a completion locks
// them, so a result racing the cancel either commits first (and its
// step.completed is written) or finds its command gone. No event is
// written for a cancel. The step is then collected like any unreferenced
// one. When no enrollment holds it (collected, or every enrollment
// finished) the error wraps storage.ErrStepNotFound.
//
// An error part-way leaves the transactions before it committed, each
// enrollment wholly cancelled or not at all: calling it again finishes.
func (s *Storage) CancelStep(ctx context.Context, stepID int64) (int, error) {
	total := 0
	for {
		// Non-locking: nobody can add an enrollment to an existing step,
		// so the listing only shrinks.
		ids, err := queryStrings(ctx, s.db, qGetStepEnrollmentIDs, stepID, cancelIDsPerTx)
		if err != nil {
			return total, fmt.Errorf("cancelling step %d: listing its enrollments: %w", stepID, err)
		}
		if len(ids) == 0 {
			break
		}
		var n int
		err = s.inTx(ctx, storage.OpCancelSteps, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			n = 0
			return chunks(ids, cancelIDsPerLock, func(c []string) error {
				keys, err := queryList(ctx, tx, expand(qLockStepRows, len(c)), append(args(c), stepID), func(rs *sql.Rows) ([2]string, error) {
					var k [2]string
					return k, rs.Scan(&k[0], &k[1])
				})
				if err != nil {
					return fmt.Errorf("locking rows: %w", err)
				}
				for i, k := range keys {
					if i == 0 || k[0] != keys[i-1][0] {
						n++
					}
				}
				if len(keys) == 0 {
					return nil
				}
				if _, err := tx.ExecContext(ctx, expand(qDeleteStepRows, len(c)), append(args(c), stepID)...); err != nil {
					return fmt.Errorf("deleting rows: %w", err)
				}
				return nil
			})
		})
		if err != nil {
			return total, fmt.Errorf("cancelling step %d (%d enrollments cancelled before): %w", stepID, total, err)
		}
		total += n
	}
	// Also when nothing was left to cancel: a step that lingers
	// unreferenced is collected now.
	s.afterRelease(ctx, []int64{stepID})
	if total == 0 {
		return 0, fmt.Errorf("cancelling step %d: no enrollment holds it: %w", stepID, storage.ErrStepNotFound)
	}
	return total, nil
}

// CancelWorkflowInstance cancels every step of one workflow instance, as
// CancelStep does, and returns how many steps had enrollments to cancel.
func (s *Storage) CancelWorkflowInstance(ctx context.Context, workflowName, instanceID string) (int, error) {
	switch {
	case workflowName == "":
		return 0, storage.Errorf(storage.EInvalid, "workflow_name: missing")
	case instanceID == "":
		return 0, storage.Errorf(storage.EInvalid, "instance_id: missing")
	case !s.holds(ctx, workflowName, instanceID):
		return 0, nil
	}
	cancelled := 0
	var after int64
	for {
		steps, err := queryInt64s(ctx, s.db, qInstanceSteps, instanceID, workflowName, after, MaxPage)
		if err != nil {
			return cancelled, fmt.Errorf("cancelling workflow %s instance %s: listing its steps: %w", workflowName, instanceID, err)
		}
		for _, id := range steps {
			_, err := s.CancelStep(ctx, id)
			switch {
			case err == nil:
				cancelled++
			case !errors.Is(err, storage.ErrStepNotFound):
				return cancelled, fmt.Errorf("cancelling workflow %s instance %s: %w", workflowName, instanceID, err)
			}
		}
		if len(steps) < MaxPage {
			return cancelled, nil
		}
		after = steps[len(steps)-1]
	}
}
