// Package events defines the events stepcollect sends to the workflow
// engine (docs/reference.md, "Events"). Each is written to the MySQL outbox in the
// same transaction as the state change that caused it, then delivered.
package events

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"strconv"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

// Event types.
const (
	// StepCompleted: the last outstanding command of one enrollment's step
	// was answered. Holds that enrollment, every command with its result.
	StepCompleted = "step.completed"
	// StepTimedOut: the step's timeout passed with that enrollment not done.
	StepTimedOut = "step.timed_out"
	// StepDue: a step's not_until passed; holds the raw commands to send.
	StepDue = "step.due"
)

// Event is one callback body.
type Event struct {
	// EventID is stable and unique: the same on every delivery attempt, and
	// derived from what the event is about and the database's salt (ID), so
	// the state change that writes it can never write it twice, and another
	// database's event about a step of the same id never shares it.
	EventID   string    `json:"event_id"`
	Type      string    `json:"type"`
	CreatedAt time.Time `json:"created_at"`
	Step      Step      `json:"step"`
}

// Step is the step an event is about. It is self-contained: the steps row
// may be collected long before the event is delivered.
type Step struct {
	StepID       int64     `json:"step_id"`
	WorkflowName string    `json:"workflow_name"`
	InstanceID   string    `json:"instance_id"`
	StepName     string    `json:"step_name"`
	Context      []byte    `json:"context"` // standard base64 in JSON
	IDs          []string  `json:"ids"`
	Commands     []Command `json:"commands"`
}

// Command is one MDM command of the step, with its result where there is one.
type Command struct {
	CommandUUID string `json:"command_uuid"`
	RequestType string `json:"request_type"`
	Completed   bool   `json:"completed"`
	Result      []byte `json:"result,omitempty"`  // the device's result plist (base64)
	Command     []byte `json:"command,omitempty"` // step.due: the raw command to send (base64)
}

// Salt is a database's own random value that every event id it writes
// depends on (the storage keeps it in the database: docs/reference.md,
// "Events to the workflow engine"). Step ids are a database's
// AUTO_INCREMENT: a second deployment, or a database made anew, numbers its
// steps from 1 again, and a workflow engine that deduplicates on event_id
// would drop their events as already seen.
type Salt uint64

// ID derives the event id of an event of type typ about step stepID and, for
// per-enrollment events, enrollment (empty otherwise), in the database
// salted salt.
func ID(salt Salt, typ string, stepID int64, enrollment string) string {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(salt))
	h.Write(b[:])
	h.Write([]byte(typ))
	h.Write([]byte{0})
	h.Write([]byte(strconv.FormatInt(stepID, 10)))
	h.Write([]byte{0})
	h.Write([]byte(enrollment))
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// FromStepResult builds a per-enrollment event (step.completed or
// step.timed_out) from NanoCMD's step result for stepID, in the database
// salted salt.
func FromStepResult(salt Salt, typ string, stepID int64, r *nanostorage.StepResult, at time.Time) *Event {
	enrollment := ""
	if len(r.IDs) == 1 {
		enrollment = r.IDs[0]
	}
	ev := &Event{
		EventID:   ID(salt, typ, stepID, enrollment),
		Type:      typ,
		CreatedAt: at.UTC(),
		Step: Step{
			StepID: stepID, WorkflowName: r.WorkflowName, InstanceID: r.InstanceID, StepName: r.Name,
			Context: r.Context, IDs: r.IDs, Commands: make([]Command, 0, len(r.Commands)),
		},
	}
	for _, c := range r.Commands {
		ev.Step.Commands = append(ev.Step.Commands, Command{
			CommandUUID: c.CommandUUID, RequestType: c.RequestType, Completed: c.Completed, Result: c.ResultReport,
		})
	}
	return ev
}

// Due builds the step.due event of step stepID: all its enrollments, and
// the raw commands to send to them now, in the database salted salt.
func Due(salt Salt, stepID int64, se *nanostorage.StepEnqueueing, at time.Time) *Event {
	ev := &Event{
		EventID:   ID(salt, StepDue, stepID, ""),
		Type:      StepDue,
		CreatedAt: at.UTC(),
		Step: Step{
			StepID: stepID, WorkflowName: se.WorkflowName, InstanceID: se.InstanceID, StepName: se.Name,
			Context: se.Context, IDs: se.IDs, Commands: make([]Command, 0, len(se.Commands)),
		},
	}
	for _, c := range se.Commands {
		ev.Step.Commands = append(ev.Step.Commands, Command{CommandUUID: c.CommandUUID, RequestType: c.RequestType, Command: c.Command})
	}
	return ev
}
