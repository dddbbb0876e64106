package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/go-sql-driver/mysql"
	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/storage"
)

// Column sizes of NanoCMD's schema, checked up front so that an oversized
// value is named instead of failing (or, without strict mode, truncating).
const (
	maxNameLen        = 255 // workflow_name, instance_id, step_name, enrollment_id
	maxCommandUUIDLen = 127
	maxRequestTypeLen = 63
	maxMediumText     = 1<<24 - 1
)

// idCommandRowsPerInsert bounds one multi-row INSERT into id_commands
// (5 placeholders a row).
const idCommandRowsPerInsert = 1000

// StoreStep stores a step, atomically: the steps row, its raw commands (for
// a NotUntil step) and one id_commands row per enrollment and command, all in
// one transaction, or nothing.
func (s *Storage) StoreStep(ctx context.Context, step *nanostorage.StepEnqueuingWithConfig, pushTime time.Time) error {
	_, err := s.StoreStepID(ctx, step, pushTime)
	return err
}

// StoreStepID is StoreStep returning the new step's id. A command UUID that
// one of the enrollments already holds is a storage.EConflict error naming
// both.
func (s *Storage) StoreStepID(ctx context.Context, step *nanostorage.StepEnqueuingWithConfig, pushTime time.Time) (int64, error) {
	if err := validateStep(step); err != nil {
		return 0, err
	}
	if err := s.checkStepSize(step); err != nil {
		return 0, err
	}
	var lastPush sql.NullTime
	if step.NotUntil.IsZero() {
		// sent now by the caller; NotUntil steps get theirs when sent.
		lastPush = nullTime(pushTime)
	}
	var stepID, prevStepID int64
	err := s.inTx(ctx, storage.OpStoreStep, func(ctx context.Context, tx *sql.Tx, a *attempt) error {
		stepID = 0
		if a.ambiguousCommit && prevStepID != 0 {
			// The last try's COMMIT answer was lost. Its step row is the
			// evidence: present, that try committed (and retrying would
			// meet its own rows as a conflict); absent, it did not.
			var wf, inst string
			err := tx.QueryRowContext(ctx, qStepOwnedBy, prevStepID).Scan(&wf, &inst)
			switch {
			case err == nil && wf == step.WorkflowName && inst == step.InstanceID:
				stepID = prevStepID
				return nil
			case err != nil && !errors.Is(err, sql.ErrNoRows):
				return fmt.Errorf("looking for step %d after a lost COMMIT answer: %w", prevStepID, err)
			}
		}
		res, err := tx.ExecContext(ctx, qCreateStep, step.WorkflowName, step.InstanceID,
			nullString(step.Name), step.Context, nullTime(step.NotUntil), nullTime(step.Timeout), len(step.IDs))
		if err != nil {
			return fmt.Errorf("inserting step: %w", err)
		}
		if stepID, err = res.LastInsertId(); err != nil {
			return fmt.Errorf("inserting step: %w", err)
		}
		prevStepID = stepID
		a.madeProgress()
		if !step.NotUntil.IsZero() {
			if err := s.insertRawCommands(ctx, tx, stepID, step.Commands); err != nil {
				return err
			}
			a.madeProgress()
		}
		// Rows are built one INSERT at a time, never ids x commands at
		// once: memory stays at one statement's worth however large the
		// step.
		vals := make([]any, 0, 5*min(idCommandRowsPerInsert, len(step.IDs)*len(step.Commands)))
		flush := func() error {
			if len(vals) == 0 {
				return nil
			}
			q := qCreateIDCommands + rowsOf(qCreateIDCommandsRow, len(vals)/5)
			if _, err := tx.ExecContext(ctx, q, vals...); err != nil {
				return fmt.Errorf("inserting enrollment commands of step %d: %w", stepID, err)
			}
			a.madeProgress()
			vals = vals[:0]
			return nil
		}
		for _, id := range step.IDs {
			for _, c := range step.Commands {
				vals = append(vals, id, c.CommandUUID, stepID, c.RequestType, lastPush)
				if len(vals) == 5*idCommandRowsPerInsert {
					if err := flush(); err != nil {
						return err
					}
				}
			}
		}
		return flush()
	})
	if mysqlErrNo(err) == errDupEntry {
		return 0, s.conflict(ctx, step, err)
	}
	if err != nil {
		return 0, fmt.Errorf("storing step (workflow %s, instance %s, %d ids): %w", step.WorkflowName, step.InstanceID, len(step.IDs), dataError(err))
	}
	s.learnFanOut(ctx, stepID, step)
	return stepID, nil
}

// learnFanOut readies this process to predict the first result of each
// enrollment of a fan-out it just stored (hints.seed): the step's shape,
// and its context as the server stored it, read back by key (the server's
// copy is the one events carry, whatever its column made of the bytes
// sent). One point read a step, instead of a locking read for every
// result already in flight when the first one commits. A step of one
// enrollment is left as it was: its result reads the step anyway. A read
// that fails only leaves the hint unset.
func (s *Storage) learnFanOut(ctx context.Context, stepID int64, step *nanostorage.StepEnqueuingWithConfig) {
	if s.hints.off || len(step.IDs) < 2 || len(step.Commands) > predictMaxRows {
		return
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	if _, err := s.readStep(ctx, s.db, stepID); err != nil {
		return
	}
	s.hints.seed(stepID, step.Commands)
}

// insertRawCommands stores a NotUntil step's raw commands, as many to a
// statement as fit the server's packet.
func (s *Storage) insertRawCommands(ctx context.Context, tx *sql.Tx, stepID int64, cmds []nanostorage.StepCommandRaw) error {
	for len(cmds) > 0 {
		n, size := 0, stmtOverhead
		for n < len(cmds) {
			row := rawCommandRowCost(cmds[n])
			if n > 0 && size+row > s.maxPacket {
				break
			}
			n, size = n+1, size+row
		}
		vals := make([]any, 0, 4*n)
		for _, c := range cmds[:n] {
			vals = append(vals, stepID, c.CommandUUID, c.RequestType, c.Command)
		}
		q := qCreateStepCommands + rowsOf(qCreateStepCommandsRow, n)
		if _, err := tx.ExecContext(ctx, q, vals...); err != nil {
			return fmt.Errorf("inserting raw commands of step %d: %w", stepID, err)
		}
		cmds = cmds[n:]
	}
	return nil
}

// conflict names the enrollment and command UUID behind a duplicate-key
// error, read after the rollback.
func (s *Storage) conflict(ctx context.Context, step *nanostorage.StepEnqueuingWithConfig, dupErr error) error {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	uuids := make([]string, len(step.Commands))
	for i, c := range step.Commands {
		uuids[i] = c.CommandUUID
	}
	var enrollment, uuid string
	err := chunks(step.IDs, maxInList, func(idsChunk []string) error {
		q := expand(qFindConflict, len(uuids), len(idsChunk))
		err := s.db.QueryRowContext(ctx, q, append(args(uuids), args(idsChunk)...)...).Scan(&enrollment, &uuid)
		if err == nil {
			return errFound
		}
		if errors.Is(err, sql.ErrNoRows) {
			return nil
		}
		return err
	})
	if errors.Is(err, errFound) {
		return storage.Errorf(storage.EConflict, "enrollment %q already holds command %q", enrollment, uuid)
	}
	// No enrollment holds one of the commands: the step repeats itself
	// to the database, which compares ids and UUIDs as their column's
	// collation does (NanoCMD's schema: case-insensitive, trailing
	// spaces ignored) where validateStep compared bytes.
	if i, j, ok := foldedRepeat(step.IDs); ok {
		return storage.Errorf(storage.EInvalid, "ids[%d]: %q repeats ids[%d] (%q) to the database, which compares ids without regard to case or trailing spaces", i, step.IDs[i], j, step.IDs[j])
	}
	if i, j, ok := foldedRepeat(uuids); ok {
		return storage.Errorf(storage.EInvalid, "commands[%d].command_uuid: %q repeats commands[%d] (%q) to the database, which compares UUIDs without regard to case or trailing spaces", i, uuids[i], j, uuids[j])
	}
	var me *mysql.MySQLError
	if errors.As(dupErr, &me) {
		dupErr = errors.New(me.Message)
	}
	return storage.Errorf(storage.EConflict, "storing step (workflow %s, instance %s): %v: an enrollment and command UUID of it were already held, or the database took two of them to be one", step.WorkflowName, step.InstanceID, dupErr)
}

// foldID is id as the default collations compare it: case and trailing
// spaces set aside.
func foldID(id string) string { return strings.ToLower(strings.TrimRight(id, " ")) }

// foldedRepeat finds list[i] equal to an earlier list[j] under foldID.
func foldedRepeat(list []string) (i, j int, ok bool) {
	seen := make(map[string]int, len(list))
	for i, s := range list {
		k := foldID(s)
		if j, dup := seen[k]; dup {
			return i, j, true
		}
		seen[k] = i
	}
	return 0, 0, false
}

var errFound = errors.New("found")

// validateStep checks step the way an API caller needs to hear about it: one
// line naming the field, before anything is written.
func validateStep(step *nanostorage.StepEnqueuingWithConfig) error {
	inv := func(format string, a ...any) error { return storage.Errorf(storage.EInvalid, format, a...) }
	switch {
	case step == nil:
		return inv("step: missing")
	case step.WorkflowName == "":
		return inv("workflow_name: missing")
	case len(step.WorkflowName) > maxNameLen:
		return inv("workflow_name: longer than %d bytes", maxNameLen)
	case hasControl(step.WorkflowName):
		return inv("workflow_name: %q holds a control character", step.WorkflowName)
	case step.InstanceID == "":
		return inv("instance_id: missing")
	case len(step.InstanceID) > maxNameLen:
		return inv("instance_id: longer than %d bytes", maxNameLen)
	case hasControl(step.InstanceID):
		return inv("instance_id: %q holds a control character", step.InstanceID)
	case len(step.Name) > maxNameLen:
		return inv("step_name: longer than %d bytes", maxNameLen)
	case hasControl(step.Name):
		return inv("step_name: %q holds a control character", step.Name)
	case len(step.Context) > maxMediumText:
		return inv("context: larger than %d bytes", maxMediumText)
	case !storableTime(step.NotUntil):
		return inv("not_until: %s is outside what MySQL can store (%s to %s)", step.NotUntil.UTC().Format(time.RFC3339), minStorableTime.Format(time.RFC3339), maxStorableTime.Format(time.RFC3339))
	case !storableTime(step.Timeout):
		return inv("timeout: %s is outside what MySQL can store (%s to %s)", step.Timeout.UTC().Format(time.RFC3339), minStorableTime.Format(time.RFC3339), maxStorableTime.Format(time.RFC3339))
	case len(step.IDs) == 0:
		return inv("ids: empty")
	case len(step.Commands) == 0:
		return inv("commands: empty")
	}
	seenID := make(map[string]int, len(step.IDs))
	for i, id := range step.IDs {
		switch j, dup := seenID[id]; {
		case id == "":
			return inv("ids[%d]: empty", i)
		case strings.TrimSpace(id) != id:
			// no enrollment id has any, and MariaDB takes "A " for "A"
			return inv("ids[%d]: %q begins or ends with white space", i, id)
		case hasControl(id):
			// no enrollment id has one either: a client's mistake
			return inv("ids[%d]: %q holds a control character", i, id)
		case len(id) > maxNameLen:
			return inv("ids[%d]: longer than %d bytes", i, maxNameLen)
		case dup:
			return inv("ids[%d]: %q repeats ids[%d]", i, id, j)
		}
		seenID[id] = i
	}
	seenUUID := make(map[string]int, len(step.Commands))
	for i, c := range step.Commands {
		switch j, dup := seenUUID[c.CommandUUID]; {
		case c.CommandUUID == "":
			return inv("commands[%d].command_uuid: missing", i)
		case strings.TrimSpace(c.CommandUUID) != c.CommandUUID:
			return inv("commands[%d].command_uuid: %q begins or ends with white space", i, c.CommandUUID)
		case hasControl(c.CommandUUID):
			return inv("commands[%d].command_uuid: %q holds a control character", i, c.CommandUUID)
		case len(c.CommandUUID) > maxCommandUUIDLen:
			return inv("commands[%d].command_uuid: longer than %d bytes", i, maxCommandUUIDLen)
		case dup:
			return inv("commands[%d].command_uuid: %q repeats commands[%d]", i, c.CommandUUID, j)
		case c.RequestType == "":
			return inv("commands[%d].request_type: missing", i)
		case len(c.RequestType) > maxRequestTypeLen:
			return inv("commands[%d].request_type: longer than %d bytes", i, maxRequestTypeLen)
		case hasControl(c.RequestType):
			return inv("commands[%d].request_type: %q holds a control character", i, c.RequestType)
		case len(c.Command) > maxMediumText:
			return inv("commands[%d].command: larger than %d bytes", i, maxMediumText)
		case !step.NotUntil.IsZero() && len(c.Command) == 0:
			return inv("commands[%d].command: missing (a not_until step keeps its raw commands to send later)", i)
		}
		seenUUID[c.CommandUUID] = i
	}
	return nil
}

// hasControl reports whether s holds a C0 or C1 control character or DEL,
// which no enrollment id, command UUID or name holds (they would be shown,
// logged and compared as something else).
func hasControl(s string) bool {
	return strings.ContainsFunc(s, unicode.IsControl)
}

// The TIMESTAMP columns' range (not_until, timeout), on MySQL 8 and on
// MariaDB before 11.5. A time outside it is the caller's mistake, named as
// such, not a storage failure to retry.
var (
	minStorableTime = time.Date(1970, 1, 1, 0, 0, 1, 0, time.UTC)
	maxStorableTime = storage.LastStorableTime
)

func storableTime(t time.Time) bool {
	return t.IsZero() || (!t.Before(minStorableTime) && !t.After(maxStorableTime))
}

// rowsOf repeats one VALUES row n times, comma-separated.
func rowsOf(row string, n int) string {
	return strings.TrimSuffix(strings.Repeat(row+", ", n), ", ")
}

// CancelSteps cancels enrollment id's steps: all of them, or those of
// workflowName. It deletes only id's own rows, then collects exactly the
// steps it touched (no scan of the whole table).
func (s *Storage) CancelSteps(ctx context.Context, id, workflowName string) error {
	if id == "" {
		return storage.Errorf(storage.EInvalid, "cancel steps: enrollment id: empty")
	}
	if !s.holds(ctx, id, workflowName) {
		return nil // no step is this enrollment's or this workflow's
	}
	var stepIDs []int64
	err := s.inTx(ctx, storage.OpCancelSteps, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
		var err error
		stepIDs, err = queryInt64s(ctx, tx, qLockEnrollmentRows, id)
		if err != nil {
			return fmt.Errorf("locking enrollment rows: %w", err)
		}
		if workflowName != "" && len(stepIDs) > 0 {
			all := stepIDs
			stepIDs = nil
			err = chunks(all, maxInList, func(c []int64) error {
				ids, err := queryInt64s(ctx, tx, expand(qFilterStepsByWorkflow, len(c)), append(args(c), workflowName)...)
				stepIDs = append(stepIDs, ids...)
				return err
			})
			if err != nil {
				return fmt.Errorf("filtering steps by workflow: %w", err)
			}
		}
		return chunks(stepIDs, maxInList, func(c []int64) error {
			_, err := tx.ExecContext(ctx, expand(qDeleteEnrollmentStepsRows, len(c)), args(c, id)...)
			if err != nil {
				return fmt.Errorf("deleting enrollment rows: %w", err)
			}
			return nil
		})
	})
	if err != nil {
		return fmt.Errorf("cancelling steps (enrollment %s, workflow %q): %w", id, workflowName, err)
	}
	s.afterRelease(ctx, stepIDs)
	return nil
}

// RetrieveOutstandingWorkflowStatus returns those of ids that have a
// command outstanding in a step of workflowName.
func (s *Storage) RetrieveOutstandingWorkflowStatus(ctx context.Context, workflowName string, ids []string) ([]string, error) {
	if !s.holds(ctx, workflowName) {
		return nil, nil
	}
	var out []string
	err := chunks(s.holdable(ctx, ids), maxInList, func(c []string) error {
		got, err := queryStrings(ctx, s.db, expand(qOutstandingIDs, len(c)), append(args(c), workflowName)...)
		out = append(out, got...)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("outstanding ids (workflow %s, %d ids): %w", workflowName, len(ids), err)
	}
	return asAsked(out, ids), nil
}

// asAsked names each id the database found as the caller asked for it. The
// database matches ids as their column's collation compares them (in
// NanoCMD's schema, without regard to case or trailing spaces), and the
// engine takes the ids it is told are running out of the ones it starts
// by exact comparison: told "CaseA" is running, it started an exclusive
// workflow again for "casea", the same enrollment to the database (and to
// the MDM server), with its step stored under the other spelling.
func asAsked(found, asked []string) []string {
	if len(found) == 0 {
		return found
	}
	byFold := make(map[string][]string, len(asked))
	for _, id := range asked {
		byFold[foldID(id)] = append(byFold[foldID(id)], id)
	}
	out := make([]string, 0, len(found))
	seen := make(map[string]bool, len(found))
	add := func(id string) {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	for _, id := range found {
		spelt := byFold[foldID(id)]
		if len(spelt) == 0 {
			add(id) // a collation that folds more than case: as found
		}
		for _, a := range spelt { // the exact spelling among them
			add(a)
		}
	}
	return out
}
