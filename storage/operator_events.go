package storage

import (
	"errors"
	"time"
)

// Event states, as GET /v1/events reports and filters them
// (docs/reference.md, "The outbox").
const (
	// EventPending: not held, and no try has failed since the event was
	// written or released (it may be in delivery right now).
	EventPending = "pending"
	// EventFailing: not held, and at least one try failed since it was
	// written or released; tried again at NextAttemptAt.
	EventFailing = "failing"
	// EventHeld: failed the worker's -max-delivery-attempts, or outlived
	// its -max-delivery-age; not tried again until released.
	EventHeld = "held"
)

// EventStates lists every state, in the order the reference gives them.
var EventStates = []string{EventPending, EventFailing, EventHeld}

// OutboxEntry is one event as an operator sees it (GET /v1/events).
type OutboxEntry struct {
	ID           int64     `json:"-"` // the outbox row, the listing's order and cursor
	EventID      string    `json:"event_id"`
	Type         string    `json:"type"`
	StepID       int64     `json:"step_id"`
	EnrollmentID *string   `json:"enrollment_id"` // none for step.due, which names all its ids
	CreatedAt    time.Time `json:"created_at"`
	// Attempts counts the tries since the event was written or released.
	Attempts  int     `json:"attempts"`
	LastError *string `json:"last_error"`
	// NextAttemptAt is when a failed event is tried again; nil when it is
	// due now, being delivered, or held.
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	State         string     `json:"state"`
}

// EventPage is one page of the outbox, oldest first. After is the row to
// continue after; 0 once the last page was read.
type EventPage struct {
	Events []OutboxEntry
	After  int64
}

// DeliveryState is whether every worker's dispatcher is paused, and since
// when it is paused or running (nil when it was never paused).
type DeliveryState struct {
	Paused bool       `json:"paused"`
	Since  *time.Time `json:"since"`
}

// ErrEventNotFound is returned (wrapped) for an event id the outbox does
// not hold: it was delivered and removed, or never was.
var ErrEventNotFound = &Error{Code: ENotFound, Message: "no such event in the outbox (it may have been delivered)"}

// ErrDeliveryPaused is returned by a claim while an operator has paused
// delivery: nothing is claimed until it is resumed.
var ErrDeliveryPaused = errors.New("delivery paused (POST /v1/delivery/resume resumes it)")
