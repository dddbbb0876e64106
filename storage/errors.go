package storage

import (
	"errors"
	"fmt"
)

// Error codes. One HTTP mapping (in the HTTP package) turns them into
// statuses; everything else is an internal error.
const (
	EInvalid  = "invalid"   // the input is wrong; the message names the field
	EConflict = "conflict"  // the input collides with a stored row; the message names it
	ENotFound = "not_found" // the thing asked about does not exist (any more)
	ETooLarge = "too_large" // the input is over a configured or storable limit; the message names it
)

// Error is stepcollect's domain error: a code for programs and a one-line
// message for people, naming the field or row at fault.
type Error struct {
	Code    string
	Message string
}

func (e *Error) Error() string { return e.Message }

// Errorf returns an *Error with code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of the first *Error in err's chain, or "" when
// there is none.
func ErrorCode(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// ErrUnknownCommand is returned (wrapped) for a command result whose
// enrollment holds no such command: it was never sent by a workflow, or its
// step already completed, timed out or was cancelled.
var ErrUnknownCommand = &Error{Code: ENotFound, Message: "no step holds this command for this enrollment"}

// ErrStepNotFound is returned (wrapped) for a step that does not exist: it
// was collected, or never was.
var ErrStepNotFound = &Error{Code: ENotFound, Message: "no such step (it may have completed and been collected)"}

// ErrCommitUnknown is returned (wrapped) when a COMMIT's answer was lost and
// nothing in the database can show whether it went through. The caller must
// not assume either outcome.
var ErrCommitUnknown = errors.New("the COMMIT's answer was lost and nothing in the database shows whether it went through")

// ErrClaimSkipped is returned (wrapped) by a collection whose FOR UPDATE
// SKIP LOCKED claim kept skipping a step: someone holds a lock on it, which
// does not mean they will delete it. The step is not collected; try again.
var ErrClaimSkipped = errors.New("collection claim skipped: the step is locked by another transaction")

// ErrScheduleOwnedByEngine is returned by the scheduler's claims
// (SendDueSteps, TimeOutSteps, ClaimRePushes) on a database that
// cmd/nanocmd marked as its own: there NanoCMD's engine worker acts on
// timeouts, re-pushes and
// NotUntil, and a step.due or step.timed_out event would take its steps
// from it (docs/runbook.md, "With NanoCMD").
var ErrScheduleOwnedByEngine = errors.New("this database's step timeouts and not_until belong to NanoCMD's engine (cmd/nanocmd marked it): stepcollect's scheduler leaves them alone")
