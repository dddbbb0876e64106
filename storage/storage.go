// Package storage holds stepcollect's domain types and the interfaces its
// parts talk through. The step, result and subscription types themselves are
// NanoCMD's (github.com/micromdm/nanocmd/engine/storage): stepcollect's
// storage is a drop-in NanoCMD backend, so it speaks NanoCMD's vocabulary.
package storage

import (
	"context"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

// AllStorage is NanoCMD's full storage interface, which every stepcollect
// backend satisfies.
type AllStorage = nanostorage.AllStorage

// ReleasedStep is a candidate for collection: a step some of whose
// id_commands rows a committed transaction deleted (the last of them, or
// not: it may still be referenced, and Collect checks), or one a read
// already saw unreferenced (the sweeper's). "Unreferenced" is terminal: id_commands rows are only ever inserted
// together with a new steps row, so a step can never gain a reference
// again, and a check made after the commit that removed its last reference
// sees it unreferenced however late it runs.
type ReleasedStep struct {
	ID int64 `json:"id"`
	// ObservedAt is when the commit that released the step's rows
	// finished. Collection lag is measured from here.
	ObservedAt time.Time `json:"observed_at"`
}

// ReleaseSink is the storage's hook for the steps a commit released: the
// storage calls it after its own transaction has committed, with every
// step that transaction released rows of, unchecked, instead of collecting
// them inline. It only passes them on (the api's collector.Handoff queues
// them); the check, claim and deletes are the collector's, later. An error
// is logged and counted, never returned to the storage's caller, and the
// step waits for a later collection or sweep.
type ReleaseSink interface {
	StepsReleased(ctx context.Context, steps []ReleasedStep) error
}

// CollectOutcome names what one collection attempt found for one step. The
// values are the label values of stepcollect_collect_runs_total{outcome}.
type CollectOutcome string

const (
	// CollectCollected: claimed and deleted, with its raw commands.
	CollectCollected CollectOutcome = "collected"
	// CollectReferenced: still has id_commands rows; not ours to delete yet.
	CollectReferenced CollectOutcome = "referenced"
	// CollectClaimedElsewhere: the SKIP LOCKED claim kept skipping the row
	// (someone holds a lock on it, which does not mean they will delete
	// it) after re-checking it for a while; the step is still there and
	// the caller is told so (ErrClaimSkipped), to try again later.
	CollectClaimedElsewhere CollectOutcome = "claimed_elsewhere"
	// CollectGone: already deleted by someone else.
	CollectGone CollectOutcome = "gone"
	// CollectError: the attempt failed; the step is left for a retry/sweep.
	CollectError CollectOutcome = "error"
)

// CollectResult counts, per outcome, what a collection call did.
type CollectResult map[CollectOutcome]int

// Observer receives the storage's measurements. The metrics package has the
// Prometheus implementation; the storage defaults to one that does nothing.
type Observer interface {
	// TxRetried is called each time a transaction is rolled back and run
	// again. reason is "deadlock", "lock_wait_timeout" or "connection".
	TxRetried(op, reason string)
	// ResultCommitted is called once per StoreCommandResponse… call that
	// reached the database, with the time spent in its transaction
	// including retries.
	ResultCommitted(d time.Duration, completedStep bool, err error)
	// StepsCollected is called after a collection attempt with its outcomes
	// and, for the collected steps, when each was first observed
	// unreferenced (zero when unknown).
	StepsCollected(res CollectResult, observedAt []time.Time)
	// EventSetAside is called for each due or timed-out step whose event
	// (of eventType) could not be written, and which was set aside so
	// that the steps behind it go on.
	EventSetAside(eventType string)
}

// Transaction operations, the op label of stepcollect_tx_retries_total.
const (
	OpStoreResult   = "store command result"
	OpStoreNotNow   = "store NotNow"
	OpStoreStep     = "store step"
	OpCancelSteps   = "cancel steps"
	OpCollectSteps  = "collect steps"
	OpDueSteps      = "enqueue due steps"
	OpTimeOutSteps  = "time out steps"
	OpRePush        = "mark re-pushed"
	OpRecordStarted = "record workflow started"
	OpDeleteOrphans = "delete orphaned raw commands"
	OpClaimEvents   = "claim events"
	OpAckEvents     = "acknowledge events"
	OpRenewLeases   = "renew delivery leases"
	OpSetAside      = "set aside step"
	// OpSetDeliveryPaused is an operator's pause or resume of delivery.
	OpSetDeliveryPaused = "set delivery paused"
)

// TxOps lists every transaction operation.
var TxOps = []string{OpStoreResult, OpStoreNotNow, OpStoreStep, OpCancelSteps, OpCollectSteps,
	OpDueSteps, OpTimeOutSteps, OpRePush, OpRecordStarted, OpDeleteOrphans, OpClaimEvents, OpAckEvents, OpRenewLeases, OpSetAside, OpSetDeliveryPaused}

// Retry reasons, the reason label of stepcollect_tx_retries_total.
var RetryReasons = []string{"deadlock", "lock_wait_timeout", "connection"}

// NopObserver is an Observer that does nothing.
type NopObserver struct{}

func (NopObserver) TxRetried(string, string)                   {}
func (NopObserver) ResultCommitted(time.Duration, bool, error) {}
func (NopObserver) StepsCollected(CollectResult, []time.Time)  {}
func (NopObserver) EventSetAside(string)                       {}

var _ Observer = NopObserver{}

// ScanPage is one bounded page of a sweep over a table, by key.
type ScanPage struct {
	// Found are the keys the page turned up: unreferenced steps, or step ids
	// of orphaned raw commands.
	Found []int64
	// Next is the cursor to pass for the next page.
	Next int64
	// More is false once the end of the table was reached.
	More bool
	// Rows is how many rows the page examined.
	Rows int
}

// StepStatus is what GET /v1/steps/{id} reports of a step that still exists.
type StepStatus struct {
	StepID         int64      `json:"step_id"`
	WorkflowName   string     `json:"workflow_name"`
	InstanceID     string     `json:"instance_id"`
	StepName       string     `json:"step_name"`
	CreatedAt      *time.Time `json:"created_at"` // nil: the row has none (StepSummary.CreatedAt)
	OutstandingIDs int        `json:"outstanding_ids"`
}

// OutboxRef names one event in the outbox.
type OutboxRef struct {
	ID       int64  `json:"id"` // the outbox row
	EventID  string `json:"event_id"`
	Type     string `json:"type"`
	Attempts int    `json:"attempts"` // deliveries tried so far
}

// OutboxEvent is an event claimed for delivery.
type OutboxEvent struct {
	OutboxRef        // Attempts includes this one
	Payload   []byte // the JSON body, exactly as delivered on every attempt
	// Age is how long ago the event was written, or released by an
	// operator, when it was claimed (-max-delivery-age).
	Age time.Duration
}

// Gauges are the figures every replica exports at scrape time, read from
// the database so that whichever replica serves them, they are current.
type Gauges struct {
	OutboxPending  int           // events not yet acknowledged
	OldestEventAge time.Duration // of the oldest of them not held; 0 when none
	// UncollectedSteps is what the last sweep found unreferenced, LastSweepAge
	// how long ago it ran; Swept is false before the first sweep.
	UncollectedSteps int
	LastSweepAge     time.Duration
	Swept            bool
	// OutboxHeld counts the events held for an operator; DeliveryPaused
	// is whether an operator paused delivery (docs/reference.md).
	OutboxHeld     int
	DeliveryPaused bool
	// SetAside counts the due and timed-out steps whose event could not be
	// written, kept aside until an operator puts them back or gives them
	// up (docs/runbook.md, StepcollectEventsSetAside).
	SetAside int
}

// LastStorableTime is the latest not_until or timeout a step can have: the
// end of a TIMESTAMP column's range on MySQL 8 and on MariaDB before 11.5.
var LastStorableTime = time.Date(2038, 1, 19, 3, 14, 7, 0, time.UTC)
