// Package tasks holds stepcollect's asynq task types, their versioned JSON
// payloads, and the options they are enqueued with, in one place.
//
// Collect tasks carry no TaskID: asynq refuses a duplicate while the first
// is still active, which could swallow the enqueue of a step's last
// release, and a duplicate collect is harmless. Sweep and schedule tasks
// carry a TaskID naming their interval slot, so one runs per interval
// however many replicas tick. Why no step is stranded: docs/design.md,
// "The worker: collection and the sweeper".
package tasks

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/storage"
)

// Task types.
const (
	TypeCollect  = "stepcollect:collect"
	TypeSweep    = "stepcollect:sweep"
	TypeSchedule = "stepcollect:schedule"
)

// TaskTypes lists every task type, for metrics labels.
func TaskTypes() []string { return []string{TypeCollect, TypeSweep, TypeSchedule} }

// Queues. Sweeps and schedules have their own queue so a backlog of collect
// tasks never delays the sweep that would find what the backlog cannot.
// Events are not queued: the worker's dispatcher polls the outbox.
//
// These are the queues' labels in metrics (asynq_queue_size{queue}) and the
// prefixes of their names in Redis, which end in the deployment's
// namespace (NamesFor).
const (
	QueueCollect = "stepcollect"
	QueueSweep   = "stepcollect_sweep"
)

// queueMarker is the prefix of QueueNames.Marker.
const queueMarker = "stepcollect:queue_marker"

// QueueLabels lists every queue's label, for metrics.
func QueueLabels() []string { return []string{QueueCollect, QueueSweep} }

// QueueNames are one deployment's queues in Redis.
//
// A deployment's processes find each other's tasks by queue name alone, so
// two deployments on one Redis database (test stacks side by side, staging
// beside production) would otherwise take each other's collect tasks (each
// checks the step ids against its own database: the other's steps wait for
// a sweep) and share the sweep and schedule slots, whose TaskIDs name only
// the time: one deployment's sweep or schedule run would stand for both.
// The namespace is kept in the deployment's database
// (storage/mysql.QueueNamespace).
type QueueNames struct {
	Collect, Sweep string
	// Marker is the key whose absence tells the deployment's workers that
	// Redis lost its data (collector.WatchQueueLoss).
	Marker string
}

// NamesFor names the queues of the deployment whose namespace is ns. An
// empty ns gives the bare labels, the names of releases before namespaces
// (tests and library users that own their Redis).
func NamesFor(ns string) QueueNames {
	if ns == "" {
		return QueueNames{Collect: QueueCollect, Sweep: QueueSweep, Marker: queueMarker}
	}
	return QueueNames{Collect: QueueCollect + ":" + ns, Sweep: QueueSweep + ":" + ns, Marker: queueMarker + ":" + ns}
}

// Known reports whether the names are set (a zero QueueNames is a
// namespace not read yet).
func (q QueueNames) Known() bool { return q.Collect != "" }

// Priorities returns the worker's queues with their priorities.
func (q QueueNames) Priorities() map[string]int { return map[string]int{q.Collect: 6, q.Sweep: 4} }

// Name is the Redis name of the queue labelled label, "" for no queue of
// this deployment.
func (q QueueNames) Name(label string) string {
	switch label {
	case QueueCollect:
		return q.Collect
	case QueueSweep:
		return q.Sweep
	}
	return ""
}

// Label is the metrics label of the queue named name, "" when it is not
// one of this deployment's.
func (q QueueNames) Label(name string) string {
	switch {
	case !q.Known():
		return ""
	case name == q.Collect:
		return QueueCollect
	case name == q.Sweep:
		return QueueSweep
	}
	return ""
}

// Namespace holds a deployment's queue names, set once they are read from
// its database. A process started on a database not yet migrated serves
// /readyz before it can read them; until then it enqueues nothing.
type Namespace struct{ names atomic.Pointer[QueueNames] }

// NewNamespace returns a Namespace holding names (the zero QueueNames for
// names not known yet).
func NewNamespace(names QueueNames) *Namespace {
	n := &Namespace{}
	n.Set(names)
	return n
}

// Set records the names.
func (n *Namespace) Set(names QueueNames) { n.names.Store(&names) }

// Names returns the names; they are not Known until set.
func (n *Namespace) Names() QueueNames { return *n.names.Load() }

// PayloadVersion is the version of the payloads this build writes. A
// handler refuses versions it does not know, without retrying, so a rolling
// upgrade that got the order wrong shows up as archived tasks, not as
// misread ones.
const PayloadVersion = 1

// ErrUnknownVersion marks a payload of a version this build cannot read.
var ErrUnknownVersion = errors.New("unknown payload version")

// The payloads are this package's own types, not the storage's: a field
// renamed in storage must not silently change what is on the queue, which
// PayloadVersion exists to protect. TestPayloadWireFormat pins them.

// CollectPayload asks for the given released steps to be collected.
type CollectPayload struct {
	Version int           `json:"v"`
	Steps   []CollectStep `json:"steps"`
}

// CollectStep is one step of a collect payload.
type CollectStep struct {
	ID         int64     `json:"id"`
	ObservedAt time.Time `json:"observed_at"`
}

// ReleasedSteps is the payload's steps as the storage takes them.
func (p CollectPayload) ReleasedSteps() []storage.ReleasedStep {
	out := make([]storage.ReleasedStep, len(p.Steps))
	for i, st := range p.Steps {
		out[i] = storage.ReleasedStep{ID: st.ID, ObservedAt: st.ObservedAt}
	}
	return out
}

// SlotPayload is the payload of a periodic task, a sweep or a schedule
// run: one run for the interval slot starting at Slot (its TaskID names
// the slot, so that replicas enqueue it once between them).
type SlotPayload struct {
	Version int       `json:"v"`
	Slot    time.Time `json:"slot"`
}

// Collect options: retried soon (CollectRetryDelay) when MySQL fails or a
// claim stays skipped.
const (
	collectMaxRetry = 25 // about three minutes of tries at CollectRetryDelay
	collectTimeout  = time.Minute
)

// NewCollectTask builds the collect task for steps, on queue, and its
// options.
func NewCollectTask(queue string, steps []storage.ReleasedStep) (*asynq.Task, []asynq.Option, error) {
	p := CollectPayload{Version: PayloadVersion, Steps: make([]CollectStep, len(steps))}
	for i, st := range steps {
		p.Steps[i] = CollectStep{ID: st.ID, ObservedAt: st.ObservedAt}
	}
	b, err := json.Marshal(p)
	if err != nil {
		return nil, nil, err
	}
	// no TaskID: see the package doc
	opts := []asynq.Option{asynq.Queue(queue), asynq.MaxRetry(collectMaxRetry), asynq.Timeout(collectTimeout)}
	return asynq.NewTask(TypeCollect, b), opts, nil
}

// ParseCollect reads a collect task's payload.
func ParseCollect(t *asynq.Task) (CollectPayload, error) {
	var p CollectPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return p, fmt.Errorf("collect payload: %v: %w", err, asynq.SkipRetry)
	}
	if p.Version != PayloadVersion {
		return p, fmt.Errorf("collect payload version %d: %w: %w", p.Version, ErrUnknownVersion, asynq.SkipRetry)
	}
	return p, nil
}

// NewSweepTask builds the sweep task of the slot starting at slot, for
// sweeps every interval, on queue, and its options.
func NewSweepTask(queue string, slot time.Time, interval time.Duration) (*asynq.Task, []asynq.Option, error) {
	return newSlotTask(queue, TypeSweep, "sweep:", slot, interval)
}

// NewScheduleTask builds the schedule task (timeouts and due NotUntil
// steps) of the slot starting at slot, and its options. One per slot across
// replicas, as for sweeps. It goes on the sweep queue.
func NewScheduleTask(queue string, slot time.Time, interval time.Duration) (*asynq.Task, []asynq.Option, error) {
	return newSlotTask(queue, TypeSchedule, "schedule:", slot, interval)
}

// newSlotTask's TaskID is unique within queue (asynq keeps TaskIDs per
// queue), and so within the deployment.
func newSlotTask(queue, typ, idPrefix string, slot time.Time, interval time.Duration) (*asynq.Task, []asynq.Option, error) {
	b, err := json.Marshal(SlotPayload{Version: PayloadVersion, Slot: slot.UTC()})
	if err != nil {
		return nil, nil, err
	}
	return asynq.NewTask(typ, b), []asynq.Option{
		asynq.Queue(queue),
		asynq.TaskID(idPrefix + strconv.FormatInt(slot.Unix(), 10)),
		// held for the rest of the slot and beyond, so a replica ticking
		// late in the slot finds it taken
		asynq.Retention(interval + interval/2),
		// a failed sweep is not retried: the next slot's sweep does it
		asynq.MaxRetry(0),
		asynq.Timeout(max(interval, time.Minute)),
	}, nil
}

// CollectRetryDelay is how long asynq waits before retry n+1 of a collect
// task: 1, 2, 4 … seconds, at most 8. A collect task fails mostly because
// a claim kept being skipped (a lock held for milliseconds) or MySQL
// blinked: both are worth trying again soon, not on asynq's default
// schedule of minutes, and a MySQL restart should cost seconds once it
// answers again.
func CollectRetryDelay(n int) time.Duration {
	return min(time.Second<<min(n, 16), 8*time.Second)
}

// RetryDelay is the worker's asynq RetryDelayFunc: collect tasks back off
// as CollectRetryDelay says, everything else as asynq does by default.
func RetryDelay(n int, err error, t *asynq.Task) time.Duration {
	if t.Type() == TypeCollect {
		return CollectRetryDelay(n)
	}
	return asynq.DefaultRetryDelayFunc(n, err, t)
}

// ParseSlot reads a sweep or schedule task's payload.
func ParseSlot(t *asynq.Task) (SlotPayload, error) {
	var p SlotPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return p, fmt.Errorf("%s payload: %v: %w", t.Type(), err, asynq.SkipRetry)
	}
	if p.Version != PayloadVersion {
		return p, fmt.Errorf("%s payload version %d: %w: %w", t.Type(), p.Version, ErrUnknownVersion, asynq.SkipRetry)
	}
	return p, nil
}
