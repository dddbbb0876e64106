package events_test

import (
	"encoding/json"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/events"
)

// An event id depends on the database's salt, the type, the step and the
// enrollment, and on nothing else: the same on every retry, different for
// anything else.
func TestEventIDsAreStableAndDistinct(t *testing.T) {
	t.Parallel()
	const salt = events.Salt(0x1f2e3d4c5b6a7)
	a := events.ID(salt, events.StepCompleted, 7, "E1")
	if a != events.ID(salt, events.StepCompleted, 7, "E1") || len(a) != 32 {
		t.Fatalf("id %q is not stable, or not 32 hex digits", a)
	}
	seen := map[string]string{a: "completed/7/E1"}
	for name, id := range map[string]string{
		"timed_out/7/E1": events.ID(salt, events.StepTimedOut, 7, "E1"),
		"completed/8/E1": events.ID(salt, events.StepCompleted, 8, "E1"),
		"completed/7/E2": events.ID(salt, events.StepCompleted, 7, "E2"),
		"due/7":          events.ID(salt, events.StepDue, 7, ""),
		// the separator keeps (7, "1E1") and (71, "E1") apart
		"completed/71/E1": events.ID(salt, events.StepCompleted, 71, "E1"),
		"completed/7/1E1": events.ID(salt, events.StepCompleted, 7, "1E1"),
		// another database's step 7
		"other database: completed/7/E1": events.ID(salt+1, events.StepCompleted, 7, "E1"),
		"unsalted: completed/7/E1":       events.ID(0, events.StepCompleted, 7, "E1"),
	} {
		if other, dup := seen[id]; dup {
			t.Errorf("%s and %s share the id %s", name, other, id)
		}
		seen[id] = name
	}
}

// A step.completed body is the JSON docs/reference.md ("Events to the
// workflow engine") documents: every field named as it says, results as
// standard base64.
func TestCompletedEventJSONIsTheDocumentedOne(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.FixedZone("x", 3600))
	r := &nanostorage.StepResult{IDs: []string{"E1"}, Commands: []nanostorage.StepCommandResult{
		{CommandUUID: "U1", RequestType: "DeviceInformation", Completed: true, ResultReport: []byte("<plist/>")}}}
	r.WorkflowName, r.InstanceID, r.Name, r.Context = "wf", "inst", "step", []byte("ctx")
	ev := events.FromStepResult(3, events.StepCompleted, 5, r, at)
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"event_id":"` + events.ID(3, events.StepCompleted, 5, "E1") + `","type":"step.completed","created_at":"2026-11-29T11:00:00Z",` +
		`"step":{"step_id":5,"workflow_name":"wf","instance_id":"inst","step_name":"step","context":"Y3R4","ids":["E1"],` +
		`"commands":[{"command_uuid":"U1","request_type":"DeviceInformation","completed":true,"result":"PHBsaXN0Lz4="}]}}`
	if string(b) != want {
		t.Errorf("event JSON\n got %s\nwant %s", b, want)
	}
}
