package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/storage"
)

// idCommandRow is one id_commands row of the reporting enrollment.
type idCommandRow struct {
	commandUUID string
	stepID      int64
	requestType string
	completed   bool
	result      []byte
}

// StoreCommandResponseAndRetrieveCompletedStep commits one command result
// for enrollment id and, when it was that enrollment's last outstanding
// command of its step, returns the completed step (and the enrollment's rows
// for it are gone). A NotNow result (sc.Completed false) is recorded as not
// completed and never completes a step.
//
// The transaction locks only id's rows for the step. Collecting the step
// happens after the commit (see collect.go); its failure is logged, never
// returned, because the caller would otherwise drop a completed step that is
// already committed. A command id does not hold returns an error wrapping
// storage.ErrUnknownCommand.
func (s *Storage) StoreCommandResponseAndRetrieveCompletedStep(ctx context.Context, id string, sc *nanostorage.StepCommandResult) (*nanostorage.StepResult, error) {
	switch {
	case id == "":
		return nil, storage.Errorf(storage.EInvalid, "enrollment id: empty")
	case sc == nil:
		return nil, storage.Errorf(storage.EInvalid, "command result: missing")
	case sc.CommandUUID == "":
		return nil, storage.Errorf(storage.EInvalid, "command_uuid: empty (enrollment %s)", id)
	case len(sc.ResultReport) > maxMediumText:
		return nil, storage.Errorf(storage.ETooLarge, "result: %d bytes, more than the %d the result column holds (enrollment %s, command %s)", len(sc.ResultReport), maxMediumText, id, sc.CommandUUID)
	}
	if !sc.Completed {
		return nil, s.storeNotNow(ctx, id, sc.CommandUUID)
	}

	var (
		c     *completion
		start = time.Now()
		err   error
	)
	if s.multiStatements {
		c, err = s.completeInTwoTrips(ctx, id, sc)
	} else {
		c, err = s.completeInTx(ctx, id, sc)
	}
	s.observer.ResultCommitted(time.Since(start), c != nil && c.result != nil, err)
	if err != nil {
		if errors.Is(err, storage.ErrUnknownCommand) || c == nil || c.stepID == 0 {
			return nil, fmt.Errorf("storing result (enrollment %s, command %s): %w", id, sc.CommandUUID, dataError(err))
		}
		return nil, fmt.Errorf("storing result (enrollment %s, command %s, step %d): %w", id, sc.CommandUUID, c.stepID, dataError(err))
	}
	if c.result == nil {
		return nil, nil
	}
	s.eventsWritten(ctx, c.written)
	s.afterRelease(ctx, []int64{c.stepID})
	return c.result, nil
}

// completion is what one try of a completion transaction computed: the
// step the result belongs to and, when it was the enrollment's last
// outstanding command, the completed step and the event written for it.
type completion struct {
	stepID  int64
	result  *nanostorage.StepResult
	written []storage.OutboxRef
}

// decide reads enrollment id's locked rows for the step: whether sc is the
// last outstanding command (and if so the step result to return, given
// the step's context), or its row is to be updated. rows is never empty.
func decide(id string, rows []idCommandRow, sc *nanostorage.StepCommandResult, step func() (nanostorage.StepContext, error)) (*nanostorage.StepResult, error) {
	outstanding := 0
	var own *idCommandRow
	for i := range rows {
		if rows[i].commandUUID == sc.CommandUUID {
			own = &rows[i]
		} else if !rows[i].completed {
			outstanding++
		}
	}
	if outstanding > 0 {
		return nil, nil
	}
	sctx, err := step()
	if err != nil {
		return nil, err
	}
	this := *sc
	if this.RequestType == "" {
		this.RequestType = own.requestType
	}
	ret := &nanostorage.StepResult{StepContext: sctx, IDs: []string{id}, Commands: []nanostorage.StepCommandResult{this}}
	for _, r := range rows {
		if r.commandUUID == sc.CommandUUID {
			continue
		}
		ret.Commands = append(ret.Commands, nanostorage.StepCommandResult{
			CommandUUID:  r.commandUUID,
			RequestType:  r.requestType,
			ResultReport: r.result,
			Completed:    true,
		})
	}
	return ret, nil
}

// completeInTx is the completion as one database/sql transaction.
func (s *Storage) completeInTx(ctx context.Context, id string, sc *nanostorage.StepCommandResult) (*completion, error) {
	var (
		c = &completion{}
		// What the last try that completed the step computed, kept only
		// as the question to settle if its COMMIT answer is lost.
		prev *completion
	)
	err := s.inTx(ctx, storage.OpStoreResult, func(ctx context.Context, tx *sql.Tx, a *attempt) error {
		c = &completion{}
		rows, err := lockEnrollmentStepRows(ctx, tx, id, sc.CommandUUID)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			if a.ambiguousCommit && prev != nil {
				// Our rows are gone. The try whose answer was lost deleted
				// them, or a cancel or a timeout did: only the outbox
				// event that try wrote tells which.
				committed, err := s.completionCommitted(ctx, tx, prev.stepID, id)
				if err != nil {
					return err
				}
				if committed {
					c = prev
					return nil
				}
			}
			return storage.ErrUnknownCommand
		}
		c.stepID = rows[0].stepID

		// The last one reads the step while our rows still pin it (nobody
		// collects a step that is referenced), then releases them. A
		// step's context never changes, so every enrollment of a fan-out
		// but the first finds it cached.
		c.result, err = decide(id, rows, sc, func() (nanostorage.StepContext, error) {
			step, ok := s.steps.get(c.stepID)
			if ok {
				return step, nil
			}
			var stepName sql.NullString
			err := tx.QueryRowContext(ctx, qGetStep, c.stepID).Scan(&step.WorkflowName, &step.InstanceID, &stepName, &step.Context)
			if err != nil {
				return step, fmt.Errorf("reading step %d: %w", c.stepID, err)
			}
			step.Name = stepName.String
			s.steps.put(c.stepID, step)
			return step, nil
		})
		if err != nil {
			return err
		}
		if c.result == nil {
			// Kept for whichever of this enrollment's commands comes last.
			// Idempotent, so a retry after a lost COMMIT answer is harmless.
			if _, err = tx.ExecContext(ctx, qRecordResult, true, sc.ResultReport, id, sc.CommandUUID); err != nil {
				return fmt.Errorf("recording result: %w", err)
			}
			return nil
		}
		if _, err = tx.ExecContext(ctx, qDeleteEnrollmentStepRows, id, c.stepID); err != nil {
			return fmt.Errorf("releasing step %d: %w", c.stepID, err)
		}
		if s.outbox {
			ref, err := insertEvent(ctx, tx, events.FromStepResult(events.StepCompleted, c.stepID, c.result, time.Now()), id)
			if err != nil {
				return err
			}
			c.written = []storage.OutboxRef{ref}
		}
		prev = c
		return nil
	})
	return c, err
}

// completeInTwoTrips is completeInTx's transaction in two round trips (see
// conntx.go): START TRANSACTION, the locking read and the step read in the
// first; the update, or the delete and the outbox insert, and COMMIT in
// the second. The step is read by the command it holds, in the round trip
// that learns the step's id, after the locking read has pinned it.
func (s *Storage) completeInTwoTrips(ctx context.Context, id string, sc *nanostorage.StepCommandResult) (*completion, error) {
	var (
		c    = &completion{}
		prev *completion // as in completeInTx
	)
	err := s.inConnTx(ctx, storage.OpStoreResult, func(ctx context.Context, ct *connTx, a *attempt) error {
		c = &completion{}
		rows, step, err := lockRowsAndReadStep(ctx, ct, id, sc.CommandUUID)
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			if a.ambiguousCommit && prev != nil {
				committed, err := s.completionCommitted(ctx, ct.conn, prev.stepID, id)
				if err != nil {
					return err
				}
				if committed {
					c = prev
					return nil
				}
			}
			return storage.ErrUnknownCommand
		}
		c.stepID = rows[0].stepID
		c.result, err = decide(id, rows, sc, func() (nanostorage.StepContext, error) {
			if step == nil {
				return nanostorage.StepContext{}, fmt.Errorf("reading step %d: not found while its rows are locked", c.stepID)
			}
			return *step, nil
		})
		if err != nil {
			return err
		}
		if c.result == nil {
			if _, err := ct.execCommit(ctx, a, qRecordResult, true, sc.ResultReport, id, sc.CommandUUID); err != nil {
				return fmt.Errorf("recording result: %w", err)
			}
			return nil
		}
		// A try whose COMMIT answer is lost is settled by its event (or,
		// without the outbox, reported unknown): see completionCommitted.
		prev = c
		if !s.outbox {
			if _, err := ct.execCommit(ctx, a, qDeleteEnrollmentStepRows, id, c.stepID); err != nil {
				return fmt.Errorf("releasing step %d: %w", c.stepID, err)
			}
			return nil
		}
		ev := events.FromStepResult(events.StepCompleted, c.stepID, c.result, time.Now())
		payload, err := json.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encoding %s event: %w", ev.Type, err)
		}
		ids, err := ct.execCommit(ctx, a, qDeleteEnrollmentStepRows+"; "+qInsertOutbox,
			id, c.stepID, ev.EventID, ev.Type, ev.Step.StepID, nullString(id), payload)
		if err != nil {
			return fmt.Errorf("releasing step %d and writing event %s: %w", c.stepID, ev.EventID, err)
		}
		ref := storage.OutboxRef{EventID: ev.EventID, Type: ev.Type}
		if len(ids) > 1 {
			ref.ID = ids[1]
		}
		c.written = []storage.OutboxRef{ref}
		return nil
	})
	return c, err
}

// lockRowsAndReadStep starts the transaction, locks the enrollment's rows of
// the step commandUUID belongs to, and reads that step, in one round trip.
// The step is nil when no row was found.
func lockRowsAndReadStep(ctx context.Context, ct *connTx, id, commandUUID string) ([]idCommandRow, *nanostorage.StepContext, error) {
	rs, err := ct.beginQuery(ctx, qLockEnrollmentStepRows+"; "+qGetStepOfCommand, id, id, commandUUID, id, commandUUID)
	if err != nil {
		return nil, nil, fmt.Errorf("locking enrollment rows: %w", err)
	}
	defer rs.Close()
	rows, err := scanIDCommandRows(rs)
	if err != nil {
		return nil, nil, fmt.Errorf("locking enrollment rows: %w", err)
	}
	if !rs.NextResultSet() {
		if err := rs.Err(); err != nil {
			return nil, nil, fmt.Errorf("reading the step: %w", err)
		}
		return nil, nil, errors.New("reading the step: no result after the locking read")
	}
	var step *nanostorage.StepContext
	for rs.Next() {
		var name sql.NullString
		st := nanostorage.StepContext{}
		if err := rs.Scan(&st.WorkflowName, &st.InstanceID, &name, &st.Context); err != nil {
			return nil, nil, fmt.Errorf("reading the step: %w", err)
		}
		st.Name = name.String
		step = &st
	}
	if err := rs.Err(); err != nil {
		return nil, nil, fmt.Errorf("reading the step: %w", err)
	}
	return rows, step, nil
}

// completionCommitted settles a completion whose COMMIT answer was lost:
// its step.completed event has a deterministic id and is written in the
// same transaction, so its presence is the proof. Without the outbox
// nothing can prove it either way, and the caller gets an error rather than
// a guess.
func (s *Storage) completionCommitted(ctx context.Context, q rowQuerier, stepID int64, id string) (bool, error) {
	if !s.outbox {
		return false, fmt.Errorf("step %d: %w", stepID, storage.ErrCommitUnknown)
	}
	eventID := events.ID(events.StepCompleted, stepID, id)
	var one int
	err := q.QueryRowContext(ctx, qEventExists, eventID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("looking for event %s after a lost COMMIT answer: %w", eventID, err)
	}
	return true, nil
}

func lockEnrollmentStepRows(ctx context.Context, tx *sql.Tx, id, commandUUID string) ([]idCommandRow, error) {
	rs, err := tx.QueryContext(ctx, qLockEnrollmentStepRows, id, id, commandUUID)
	if err != nil {
		return nil, fmt.Errorf("locking enrollment rows: %w", err)
	}
	defer rs.Close()
	rows, err := scanIDCommandRows(rs)
	if err != nil {
		return nil, fmt.Errorf("locking enrollment rows: %w", err)
	}
	return rows, nil
}

// scanIDCommandRows reads the current result set of qLockEnrollmentStepRows.
func scanIDCommandRows(rs *sql.Rows) ([]idCommandRow, error) {
	var rows []idCommandRow
	for rs.Next() {
		var r idCommandRow
		if err := rs.Scan(&r.commandUUID, &r.stepID, &r.requestType, &r.completed, &r.result); err != nil {
			return nil, err
		}
		rows = append(rows, r)
	}
	return rows, rs.Err()
}

// rowQuerier is a transaction or a connection.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// storeNotNow records that the device answered NotNow: the command stays
// outstanding. One short transaction on one row of id's own.
func (s *Storage) storeNotNow(ctx context.Context, id, commandUUID string) error {
	var found bool
	err := s.inTx(ctx, storage.OpStoreNotNow, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
		res, err := tx.ExecContext(ctx, qTouchNotNow, id, commandUUID)
		if err != nil {
			return err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return err
		}
		found = n > 0
		if !found {
			// updated_at may already hold this second; only then ask.
			var rt string
			err = tx.QueryRowContext(ctx, qGetRequestType, id, commandUUID).Scan(&rt)
			found = err == nil
			if errors.Is(err, sql.ErrNoRows) {
				err = nil
			}
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("storing NotNow (enrollment %s, command %s): %w", id, commandUUID, err)
	}
	if !found {
		return fmt.Errorf("storing NotNow (enrollment %s, command %s): %w", id, commandUUID, storage.ErrUnknownCommand)
	}
	return nil
}

// RetrieveCommandRequestType returns the request type of id's command uuid,
// and whether id holds such a command at all (whether a workflow sent it).
func (s *Storage) RetrieveCommandRequestType(ctx context.Context, id string, uuid string) (string, bool, error) {
	if id == "" || uuid == "" {
		return "", false, storage.Errorf(storage.EInvalid, "request type lookup: empty enrollment id or command uuid")
	}
	var rt string
	err := s.db.QueryRowContext(ctx, qGetRequestType, id, uuid).Scan(&rt)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	} else if err != nil {
		return "", false, fmt.Errorf("request type (enrollment %s, command %s): %w", id, uuid, err)
	}
	return rt, true, nil
}

// StepStatus returns what is known of step id while it exists, and an
// error wrapping storage.ErrStepNotFound once it was collected (or never
// was).
func (s *Storage) StepStatus(ctx context.Context, id int64) (*storage.StepStatus, error) {
	st := &storage.StepStatus{StepID: id}
	var name sql.NullString
	err := s.db.QueryRowContext(ctx, qStepStatus, id).Scan(&st.WorkflowName, &st.InstanceID, &name, &st.CreatedAt, &st.OutstandingIDs)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("step %d: %w", id, storage.ErrStepNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("step status (step %d): %w", id, err)
	}
	st.StepName = name.String
	return st, nil
}
