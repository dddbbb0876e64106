package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/storage"
)

// idCommandRow is one id_commands row of the reporting enrollment.
// A large stored result is not read with the lock (see
// qLockEnrollmentStepRows): only its length, and the completion reads it
// once it knows it completes.
type idCommandRow struct {
	commandUUID string
	stepID      int64
	requestType string
	completed   bool
	resultLen   int
	result      []byte // the stored result when inlined()
}

// inlineResultMax is the largest stored result the locking read brings
// (qLockEnrollmentStepRows, which holds the same figure).
const inlineResultMax = 65536

// inlined reports whether the locking read brought r's stored result.
func (r *idCommandRow) inlined() bool { return r.completed && r.resultLen <= inlineResultMax }

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
	if err := s.checkResult(id, sc); err != nil {
		return nil, err
	}
	if !s.holds(ctx, id, sc.CommandUUID) {
		return nil, fmt.Errorf("storing result (enrollment %s, command %s): %w", id, sc.CommandUUID, storage.ErrUnknownCommand)
	}
	if !sc.Completed {
		return nil, s.storeNotNow(ctx, id, sc.CommandUUID)
	}
	c := &completion{s: s, id: id, sc: sc}
	if s.outbox {
		// Read once a process (eventSalt), before any connection is taken
		// for the transaction.
		salt, err := s.eventSalt(ctx)
		if err != nil {
			return nil, fmt.Errorf("storing result (enrollment %s, command %s): %w", id, sc.CommandUUID, err)
		}
		c.salt = salt
	}
	start := time.Now()
	var err error
	if s.twoTrips {
		err = s.inConnTx(ctx, storage.OpStoreResult, c.try)
	} else {
		err = s.inTx(ctx, storage.OpStoreResult, func(ctx context.Context, tx *sql.Tx, a *attempt) error {
			return c.try(ctx, sqlTxn{tx}, a)
		})
	}
	s.observer.ResultCommitted(time.Since(start), c.ret != nil, err)
	if err == nil && s.twoTrips {
		s.hints.learn(c)
	}
	return c.finish(ctx, err)
}

// checkResult refuses, before any transaction, a result that cannot be
// stored: the ids it needs, and a size its column and its statement hold.
func (s *Storage) checkResult(id string, sc *nanostorage.StepCommandResult) error {
	switch {
	case id == "":
		return storage.Errorf(storage.EInvalid, "enrollment id: empty")
	case sc == nil:
		return storage.Errorf(storage.EInvalid, "command result: missing")
	case sc.CommandUUID == "":
		return storage.Errorf(storage.EInvalid, "command_uuid: empty (enrollment %s)", id)
	case len(sc.ResultReport) > maxMediumText:
		return storage.Errorf(storage.ETooLarge, "result: %d bytes, more than the %d the result column holds (enrollment %s, command %s)", len(sc.ResultReport), maxMediumText, id, sc.CommandUUID)
	case escapedOver(sc.ResultReport, s.maxPacket-stmtOverhead):
		return s.tooLarge("result", fmt.Sprintf("its statement (%d bytes of result; enrollment %s, command %s)", len(sc.ResultReport), id, sc.CommandUUID), escapedLen(sc.ResultReport)+stmtOverhead)
	}
	return nil
}

// completion is one completed result's way through its transaction, which
// inTx may run several times.
type completion struct {
	s  *Storage
	id string
	sc *nanostorage.StepCommandResult
	// salt is the database's event id salt (with the outbox), read before
	// the first try: every try writes, and looks for, the same event id.
	salt events.Salt

	// what the current try found; each try starts from empty
	ret    *nanostorage.StepResult
	stepID int64
	rows   []idCommandRow // the enrollment's rows of the step, as locked
	// What the last try that completed the step computed, kept across tries
	// only as the question to settle if its COMMIT answer is lost.
	prev       *nanostorage.StepResult
	prevStepID int64
	// what the try that committed in one round trip predicted (onetrip.go)
	predicted *prediction
}

// try is the transaction body: lock the enrollment's rows of the step,
// record the result, and, when it was the last outstanding one, read the
// step and release the rows (with its step.completed in the outbox). It
// reads everything before it writes anything, so that a connTx sends the
// writes with COMMIT (see conntx.go).
func (c *completion) try(ctx context.Context, tx txn, a *attempt) error {
	c.ret, c.stepID, c.rows, c.predicted = nil, 0, nil, nil
	rows, done, err := c.lock(ctx, tx, a)
	if err != nil || done {
		return err
	}
	c.rows = rows
	if len(rows) == 0 {
		return c.rowsGone(ctx, tx, a)
	}
	c.stepID = rows[0].stepID
	own, outstanding := ownAndOutstanding(rows, c.sc.CommandUUID)
	if c.s.outbox {
		// Whether the step.completed this result would make (with the
		// results stored before it) fits, before anything is written: a
		// stored result is one its event can carry, whenever it comes, and
		// so is the step.timed_out of the results as they stand.
		if err := c.s.checkCompletedEvent(ctx, tx, c.stepID, c.id, rows, own, len(c.sc.ResultReport)); err != nil {
			return err
		}
	}
	if outstanding > 0 {
		// Kept for whichever of this enrollment's commands comes last.
		// Idempotent, so a retry after a lost COMMIT answer is harmless.
		return tx.write(ctx, "recording result", qRecordResult, true, c.sc.ResultReport, c.id, c.sc.CommandUUID)
	}
	ret, err := c.readCompletedStep(ctx, tx, own, len(rows) > 1)
	if err != nil {
		return err
	}
	if err := c.release(ctx, tx, ret); err != nil {
		return err
	}
	c.ret, c.prev, c.prevStepID = ret, ret, c.stepID
	return nil
}

// lock takes the enrollment's rows of the step. On a connTx's first try,
// a result this process can predict goes in one round trip with no
// locking read (onetrip.go; done: it committed, and c holds the completed
// step if it completed one); otherwise, or when its guard refuses, the
// locking read.
func (c *completion) lock(ctx context.Context, tx txn, a *attempt) (rows []idCommandRow, done bool, err error) {
	if ct, ok := tx.(*connTx); ok && a.n == 1 {
		if p := c.s.predict(c.id, c.sc); p != nil {
			done, err := c.oneTrip(ctx, ct, a, p)
			switch {
			case done && p.complete == nil:
				return nil, true, nil // stored, another command outstanding
			case done:
				c.stepID, c.ret, c.prev, c.prevStepID = p.stepID, p.complete, p.complete, p.stepID
				return nil, true, nil
			case err != nil && !errors.Is(err, errNoPrediction):
				return nil, false, err
			}
		}
	}
	rows, err = lockEnrollmentStepRows(ctx, tx, c.id, c.sc.CommandUUID)
	return rows, false, err
}

// rowsGone answers a try that found none of the enrollment's rows. After a
// lost COMMIT answer of a try that completed the step they are gone because
// that try deleted them, or a cancel or a timeout did: only the outbox event
// that try wrote tells which. Otherwise the command is not one of ours.
func (c *completion) rowsGone(ctx context.Context, tx txn, a *attempt) error {
	if a.ambiguousCommit && c.prev != nil {
		committed, err := c.s.completionCommitted(ctx, tx, c.salt, c.prevStepID, c.id)
		if err != nil {
			return err
		}
		if committed {
			c.ret, c.stepID = c.prev, c.prevStepID
			return nil
		}
	}
	return storage.ErrUnknownCommand
}

// ownAndOutstanding finds the reported command's row among the
// enrollment's rows of its step, and counts the others not yet completed.
func ownAndOutstanding(rows []idCommandRow, commandUUID string) (own *idCommandRow, outstanding int) {
	for i := range rows {
		if rows[i].commandUUID == commandUUID {
			own = &rows[i]
		} else if !rows[i].completed {
			outstanding++
		}
	}
	return own, outstanding
}

// readCompletedStep reads the step while the enrollment's rows still pin it
// (nobody collects a step that is referenced), with this result and, when
// the enrollment had others, the results stored before it: read once, now
// that the step is known to complete (their sizes were checked as each was
// stored).
func (c *completion) readCompletedStep(ctx context.Context, tx txn, own *idCommandRow, others bool) (*nanostorage.StepResult, error) {
	step, err := c.s.readStep(ctx, tx, c.stepID)
	if err != nil {
		return nil, err
	}
	this := *c.sc
	if this.RequestType == "" {
		this.RequestType = own.requestType
	}
	ret := &nanostorage.StepResult{StepContext: step, IDs: []string{c.id}, Commands: []nanostorage.StepCommandResult{this}}
	if !others {
		return ret, nil
	}
	if inlined, ok := c.inlinedResults(); ok {
		ret.Commands = append(ret.Commands, inlined...)
		return ret, nil
	}
	results, err := queryList(ctx, tx, qReadEnrollmentStepResults, []any{c.sc.CommandUUID, c.id, c.stepID}, func(rs *sql.Rows) (nanostorage.StepCommandResult, error) {
		r := nanostorage.StepCommandResult{Completed: true}
		return r, rs.Scan(&r.CommandUUID, &r.RequestType, &r.ResultReport)
	})
	if err != nil {
		return nil, fmt.Errorf("reading the results of step %d: %w", c.stepID, err)
	}
	for _, r := range results {
		if r.CommandUUID != c.sc.CommandUUID {
			ret.Commands = append(ret.Commands, r)
		}
	}
	return ret, nil
}

// inlinedResults are the other commands' results as the locking read
// brought them, in command_uuid order as qReadEnrollmentStepResults reads
// them, when it brought them all.
func (c *completion) inlinedResults() ([]nanostorage.StepCommandResult, bool) {
	var out []nanostorage.StepCommandResult
	for i := range c.rows {
		r := &c.rows[i]
		if r.commandUUID == c.sc.CommandUUID {
			continue
		}
		if !r.inlined() {
			return nil, false
		}
		out = append(out, nanostorage.StepCommandResult{CommandUUID: r.commandUUID, RequestType: r.requestType, ResultReport: r.result, Completed: true})
	}
	slices.SortFunc(out, func(a, b nanostorage.StepCommandResult) int { return strings.Compare(a.CommandUUID, b.CommandUUID) })
	return out, true
}

// release deletes the enrollment's rows of the completed step and, with
// the outbox, writes its step.completed in the same transaction (the
// evidence a lost COMMIT answer is settled by).
func (c *completion) release(ctx context.Context, tx txn, ret *nanostorage.StepResult) error {
	if err := tx.write(ctx, fmt.Sprintf("releasing step %d", c.stepID), qDeleteEnrollmentStepRows, c.id, c.stepID); err != nil {
		return err
	}
	return c.writeEvidence(ctx, tx, ret)
}

// writeEvidence writes, with the outbox, the completed step's
// step.completed, or its receipt (WithReceipts).
func (c *completion) writeEvidence(ctx context.Context, tx txn, ret *nanostorage.StepResult) error {
	if c.s.outbox {
		ev := events.FromStepResult(c.salt, events.StepCompleted, c.stepID, ret, time.Now())
		row, err := c.s.outboxRow(ev, c.id)
		if err != nil {
			return err
		}
		if err := tx.write(ctx, fmt.Sprintf("writing %s event %s to the outbox", ev.Type, ev.EventID), qInsertOutbox, row...); err != nil {
			return err
		}
	}
	if c.s.receipts {
		if err := tx.write(ctx, fmt.Sprintf("writing the receipt of step %d", c.stepID), qInsertReceipt, c.stepID, c.id); err != nil {
			return err
		}
	}
	return nil
}

// finish turns the transaction's outcome into the caller's answer and hands
// a released step to collection, after the commit.
func (c *completion) finish(ctx context.Context, err error) (*nanostorage.StepResult, error) {
	var le *limitError
	if errors.As(err, &le) {
		return nil, le
	}
	if err != nil && c.prevStepID != 0 {
		// A try completed the step and its COMMIT answer was lost, and no
		// later try could settle it (the server gone, or no outbox to ask):
		// the step may now be unreferenced. Asking for its collection is
		// harmless if it is not (only what nothing references is taken),
		// and without it nothing but a sweep would find it.
		c.s.afterRelease(ctx, []int64{c.prevStepID})
	}
	if err != nil {
		if errors.Is(err, storage.ErrUnknownCommand) || c.stepID == 0 {
			return nil, fmt.Errorf("storing result (enrollment %s, command %s): %w", c.id, c.sc.CommandUUID, dataError(err))
		}
		return nil, fmt.Errorf("storing result (enrollment %s, command %s, step %d): %w", c.id, c.sc.CommandUUID, c.stepID, dataError(err))
	}
	if c.ret == nil {
		return nil, nil
	}
	c.s.afterRelease(ctx, []int64{c.stepID})
	return c.ret, nil
}

// completionCommitted settles a completion whose COMMIT answer was lost:
// its step.completed event (or, WithReceipts, its receipt) has a
// deterministic id and is written in the same transaction, so its presence
// is the proof. Without either nothing can prove it either way, and the
// caller gets an error rather than a guess.
func (s *Storage) completionCommitted(ctx context.Context, tx txn, salt events.Salt, stepID int64, id string) (bool, error) {
	eventID := events.ID(salt, events.StepCompleted, stepID, id)
	var row *sql.Row
	switch {
	case s.receipts:
		row = tx.QueryRowContext(ctx, qReceiptExists, stepID, id)
	case s.outbox:
		row = tx.QueryRowContext(ctx, qEventExists, eventID)
	default:
		return false, fmt.Errorf("step %d: %w", stepID, storage.ErrCommitUnknown)
	}
	var one int
	err := row.Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("looking for the evidence of step %d's completion by enrollment %s (event %s) after a lost COMMIT answer: %w", stepID, id, eventID, err)
	}
	return true, nil
}

func lockEnrollmentStepRows(ctx context.Context, tx txn, id, commandUUID string) ([]idCommandRow, error) {
	rs, err := tx.QueryContext(ctx, qLockEnrollmentStepRows, id, id, commandUUID)
	if err != nil {
		return nil, fmt.Errorf("locking enrollment rows: %w", err)
	}
	defer rs.Close()
	var rows []idCommandRow
	for rs.Next() {
		var r idCommandRow
		if err := rs.Scan(&r.commandUUID, &r.stepID, &r.requestType, &r.completed, &r.resultLen, &r.result); err != nil {
			return nil, fmt.Errorf("locking enrollment rows: %w", err)
		}
		rows = append(rows, r)
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("locking enrollment rows: %w", err)
	}
	return rows, nil
}

// rowQuerier is what readStep needs: a transaction, or the pool.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// readStep reads step stepID's context. It never changes, so every
// enrollment of a fan-out but the first finds it cached.
func (s *Storage) readStep(ctx context.Context, tx rowQuerier, stepID int64) (nanostorage.StepContext, error) {
	step, ok := s.steps.get(stepID)
	if ok {
		return step, nil
	}
	var stepName sql.NullString
	err := tx.QueryRowContext(ctx, qGetStep, stepID).Scan(&step.WorkflowName, &step.InstanceID, &stepName, &step.Context)
	if err != nil {
		return step, fmt.Errorf("reading step %d: %w", stepID, err)
	}
	step.Name = stepName.String
	s.steps.put(stepID, step)
	return step, nil
}

// checkCompletedEvent refuses a result of n bytes for own when the
// step.completed event of id's step, with every result id stored for it
// and this one, would not fit an outbox INSERT. It reads the step's names
// and the length of its context, never the context or the results.
func (s *Storage) checkCompletedEvent(ctx context.Context, tx txn, stepID int64, id string, rows []idCommandRow, own *idCommandRow, n int) error {
	var size eventSize
	if step, ok := s.steps.get(stepID); ok {
		size.step(step.WorkflowName, step.InstanceID, step.Name, len(step.Context))
	} else {
		var step nanostorage.StepContext
		var name sql.NullString
		var contextLen int
		if err := tx.QueryRowContext(ctx, qGetStepSizes, stepID).Scan(&step.WorkflowName, &step.InstanceID, &name, &contextLen, &step.Context); err != nil {
			return fmt.Errorf("reading the size of step %d: %w", stepID, err)
		}
		step.Name = name.String
		if contextLen <= maxCachedContext {
			s.steps.put(stepID, step)
		}
		size.step(step.WorkflowName, step.InstanceID, step.Name, contextLen)
	}
	size.id(id)
	stored := 0
	for _, r := range rows {
		if r.commandUUID == own.commandUUID {
			size.command(r.commandUUID, r.requestType, n)
			continue
		}
		size.command(r.commandUUID, r.requestType, r.resultLen)
		stored += r.resultLen
	}
	if int(size) > s.eventLimit() {
		return s.tooLarge("result", fmt.Sprintf("its step.completed (%d bytes of result, %d stored before it; enrollment %s, command %s, step %d)", n, stored, id, own.commandUUID, stepID), int(size))
	}
	return nil
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

// PruneReceipts deletes the receipts (WithReceipts) older than age by the
// server's clock, at most 1000 a statement, and returns how many went. A
// receipt is asked for only by the retry of its own transaction, within
// seconds: an age of minutes is safe. Safe on any number of replicas.
func (s *Storage) PruneReceipts(ctx context.Context, age time.Duration) (int64, error) {
	var total int64
	for {
		res, err := s.db.ExecContext(ctx, qPruneReceipts, age.Microseconds())
		if err != nil {
			return total, fmt.Errorf("pruning receipts older than %v: %w", age, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("pruning receipts: %w", err)
		}
		total += n
		if n < 1000 {
			return total, nil
		}
	}
}

// StepStatus returns what is known of step id while it exists, and an
// error wrapping storage.ErrStepNotFound once it was collected (or never
// was).
func (s *Storage) StepStatus(ctx context.Context, id int64) (*storage.StepStatus, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	st := &storage.StepStatus{StepID: id}
	var name sql.NullString
	var created sql.NullTime
	err := s.db.QueryRowContext(ctx, qStepStatus, id).Scan(&st.WorkflowName, &st.InstanceID, &name, &created, &st.OutstandingIDs)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("step %d: %w", id, storage.ErrStepNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("step status (step %d): %w", id, err)
	}
	st.StepName = name.String
	if created.Valid {
		st.CreatedAt = &created.Time
	}
	return st, nil
}
