package testkit

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

// EnrollmentID is the i-th enrollment of a step built with prefix.
func EnrollmentID(prefix string, i int) string { return fmt.Sprintf("%s-ID-%05d", prefix, i) }

// CommandUUID is the c-th command of a step built with prefix.
func CommandUUID(prefix string, c int) string { return fmt.Sprintf("%s-UUID-%05d", prefix, c) }

// FanOut is one step of cmds commands (DeviceInformation, "<plist/>") to n
// enrollments, every name derived from prefix: enrollments
// EnrollmentID(prefix, i), commands CommandUUID(prefix, c), workflow
// io.stepcollect.test.<prefix>, instance <prefix>-instance, context
// ctx-<prefix>.
func FanOut(prefix string, n, cmds int) *nanostorage.StepEnqueuingWithConfig {
	step := &nanostorage.StepEnqueuingWithConfig{}
	step.WorkflowName = "io.stepcollect.test." + prefix
	step.InstanceID = prefix + "-instance"
	step.Name = "step"
	step.Context = []byte("ctx-" + prefix)
	for i := range n {
		step.IDs = append(step.IDs, EnrollmentID(prefix, i))
	}
	for c := range cmds {
		step.Commands = append(step.Commands, nanostorage.StepCommandRaw{
			CommandUUID: CommandUUID(prefix, c), RequestType: "DeviceInformation", Command: []byte("<plist/>"),
		})
	}
	return step
}

// StepEach is NanoCMD's most common shape: n steps, a step of its own (one
// command) for each of n enrollments, step i built as FanOut of
// <prefix>-<i>.
func StepEach(prefix string, n int) []*nanostorage.StepEnqueuingWithConfig {
	steps := make([]*nanostorage.StepEnqueuingWithConfig, n)
	for i := range steps {
		steps[i] = FanOut(fmt.Sprintf("%s-%05d", prefix, i), 1, 1)
	}
	return steps
}

// CommandResult is a completed command result for uuid.
func CommandResult(uuid string) *nanostorage.StepCommandResult {
	return &nanostorage.StepCommandResult{CommandUUID: uuid, Completed: true, ResultReport: []byte("<plist>" + uuid + "</plist>")}
}

// ResultStore is where results are stored: stepcollect's storage, or
// NanoCMD's.
type ResultStore interface {
	StoreCommandResponseAndRetrieveCompletedStep(ctx context.Context, id string, sc *nanostorage.StepCommandResult) (*nanostorage.StepResult, error)
}

// Complete stores, one after the other, the result of every command of
// step for each of ids, failing t on any error.
func Complete(t testing.TB, store ResultStore, step *nanostorage.StepEnqueuingWithConfig, ids ...string) {
	t.Helper()
	for _, id := range ids {
		for _, c := range step.Commands {
			if _, err := store.StoreCommandResponseAndRetrieveCompletedStep(context.Background(), id, CommandResult(c.CommandUUID)); err != nil {
				t.Fatalf("storing %s's result for %s: %v", id, c.CommandUUID, err)
			}
		}
	}
}

// V1Step is a POST /v1/steps body: one command (uuid, DeviceInformation)
// to ids, in workflow instance instance.
func V1Step(instance string, ids []string, uuid string) map[string]any {
	return map[string]any{"workflow_name": "io.example.test", "instance_id": instance, "step_name": "query", "ids": ids,
		"commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation"}}}
}

// V1FanOut is a POST /v1/steps body of one command, uuid <prefix>-CMD, to
// n enrollments <prefix>-0000…, and those enrollments.
func V1FanOut(prefix string, n int) (map[string]any, []string) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", prefix, i)
	}
	return V1Step(prefix, ids, prefix+"-CMD"), ids
}

// V1StepJSON is a POST /v1/steps body of n ids and m commands, written
// straight into a buffer: 40,000 x 2,000 is a few MB of JSON, not 80
// million of anything.
func V1StepJSON(n, m int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"workflow_name":"wf.big","instance_id":"i","ids":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"ID-%d"`, i)
	}
	b.WriteString(`],"commands":[`)
	for i := range m {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"command_uuid":"BIG-%d","request_type":"DeviceInformation"}`, i)
	}
	b.WriteString(`]}`)
	return b.Bytes()
}
