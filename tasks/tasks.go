// Package tasks holds stepcollect's asynq task types, their versioned JSON
// payloads, and the options they are enqueued with, in one place.
//
// # Why collection never strands a step
//
// asynq rejects a task whose TaskID is already taken while the first one is
// pending, active or retained. A naive "one collect task per step, enqueued
// after every commit" can therefore lose the enqueue that mattered: an
// earlier task checks while the step is still referenced, and the enqueue
// made when the last reference went is rejected because that earlier task
// is still active.
//
// stepcollect avoids the trap by enqueuing only steps it has already seen
// unreferenced, which is terminal (id_commands rows are inserted only with
// their own new step). So every collect task that exists for a step was
// created after the step became unreferenced and will itself see it so when
// it runs: a rejected duplicate (ErrTaskIDConflict) lost nothing, and is
// treated as success. Duplicates that do get through are harmless, because
// collection is idempotent (a step claimed elsewhere or already gone is
// success). The TaskID is an optimisation, not the correctness argument,
// which is why batches of several steps are enqueued without one.
//
// What the queue cannot protect against, it does not try to: an enqueue lost
// outright (Redis down at commit time, a process killed between commit and
// enqueue) is found by the sweeper, which pages through the steps table.
//
// # Why sweeps do not multiply with replicas
//
// Every worker replica runs the sweep ticker (the asynq Scheduler has no
// leader election, and neither does this). Ticks are aligned to multiples of
// the interval, and the sweep task's TaskID names that slot, retained for an
// interval: N replicas enqueue the same TaskID, one is accepted, and exactly
// one sweep runs per interval however many replicas there are. A replica
// that cannot reach Redis at its tick keeps trying within the slot, so a
// sweep runs as soon as Redis returns, and anything committed while it was
// down is collected within one interval of its return.
package tasks

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/storage"
)

// Task types.
const (
	TypeCollect = "stepcollect:collect"
	TypeSweep   = "stepcollect:sweep"
)

// Queues. Sweeps have their own queue so a backlog of collect tasks never
// delays the sweep that would find what the backlog cannot.
const (
	QueueCollect = "stepcollect"
	QueueSweep   = "stepcollect_sweep"
)

// Queues returns the worker's queues with their priorities.
func Queues() map[string]int { return map[string]int{QueueCollect: 6, QueueSweep: 4} }

// PayloadVersion is the version of the payloads this build writes. A
// handler refuses versions it does not know, without retrying, so a rolling
// upgrade that got the order wrong shows up as archived tasks, not as
// misread ones.
const PayloadVersion = 1

// ErrUnknownVersion marks a payload of a version this build cannot read.
var ErrUnknownVersion = errors.New("unknown payload version")

// CollectPayload asks for the given unreferenced steps to be collected.
type CollectPayload struct {
	Version int                        `json:"v"`
	Steps   []storage.UnreferencedStep `json:"steps"`
}

// SweepPayload asks for one sweep, for the interval slot starting at Slot.
type SweepPayload struct {
	Version int       `json:"v"`
	Slot    time.Time `json:"slot"`
}

// Collect options: no retention, so a finished task frees its TaskID at
// once; retried with asynq's backoff when MySQL fails.
const (
	collectMaxRetry = 10
	collectTimeout  = time.Minute
)

// NewCollectTask builds the collect task for steps and its options.
func NewCollectTask(steps []storage.UnreferencedStep) (*asynq.Task, []asynq.Option, error) {
	b, err := json.Marshal(CollectPayload{Version: PayloadVersion, Steps: steps})
	if err != nil {
		return nil, nil, err
	}
	opts := []asynq.Option{asynq.Queue(QueueCollect), asynq.MaxRetry(collectMaxRetry), asynq.Timeout(collectTimeout)}
	if len(steps) == 1 {
		opts = append(opts, asynq.TaskID("collect:"+strconv.FormatInt(steps[0].ID, 10)))
	}
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
// sweeps every interval, and its options.
func NewSweepTask(slot time.Time, interval time.Duration) (*asynq.Task, []asynq.Option, error) {
	b, err := json.Marshal(SweepPayload{Version: PayloadVersion, Slot: slot.UTC()})
	if err != nil {
		return nil, nil, err
	}
	return asynq.NewTask(TypeSweep, b), []asynq.Option{
		asynq.Queue(QueueSweep),
		asynq.TaskID("sweep:" + strconv.FormatInt(slot.Unix(), 10)),
		// held for the rest of the slot and beyond, so a replica ticking
		// late in the slot finds it taken
		asynq.Retention(interval + interval/2),
		// a failed sweep is not retried: the next slot's sweep does it
		asynq.MaxRetry(0),
		asynq.Timeout(max(interval, time.Minute)),
	}, nil
}

// ParseSweep reads a sweep task's payload.
func ParseSweep(t *asynq.Task) (SweepPayload, error) {
	var p SweepPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return p, fmt.Errorf("sweep payload: %v: %w", err, asynq.SkipRetry)
	}
	if p.Version != PayloadVersion {
		return p, fmt.Errorf("sweep payload version %d: %w: %w", p.Version, ErrUnknownVersion, asynq.SkipRetry)
	}
	return p, nil
}
