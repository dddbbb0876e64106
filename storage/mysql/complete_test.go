package mysql_test

import (
	"bytes"
	"fmt"
	"testing"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

// The completed step carries every command's result whole and in
// command_uuid order, whether the locking read brought the stored ones
// (up to 64 KiB) or they were read after it: results of 0, 10, 65536 and
// 65537 bytes, each answered before the last command of its step.
func TestACompletedStepCarriesEveryStoredResultWhole(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	for _, size := range []int{0, 10, 65536, 65537} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			step := b.stored(t, fmt.Sprintf("whole%d", size), 1, 3)
			bodies := [][]byte{bytes.Repeat([]byte{'a'}, size), bytes.Repeat([]byte{'b'}, 10), []byte("last")}
			var got *nanostorage.StepResult
			// the last command first, so that the stored ones are not all
			// in command order
			for _, c := range []int{2, 0, 1} {
				res, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], &nanostorage.StepCommandResult{
					CommandUUID: step.Commands[c].CommandUUID, RequestType: "DeviceInformation", ResultReport: bodies[c], Completed: true})
				if err != nil {
					t.Fatal(err)
				}
				if c != 1 && res != nil {
					t.Fatalf("step completed after command %d of 3", c)
				}
				got = res
			}
			if got == nil || len(got.Commands) != 3 {
				t.Fatalf("completed step: %+v, want the 3 commands' results", got)
			}
			// the reporting command first, then the others by command_uuid
			for i, c := range []int{1, 0, 2} {
				r := got.Commands[i]
				if r.CommandUUID != step.Commands[c].CommandUUID || !bytes.Equal(r.ResultReport, bodies[c]) || r.RequestType != "DeviceInformation" || !r.Completed {
					t.Errorf("result %d: command %s, %d bytes, %q, completed %v; want command %s, %d bytes",
						i, r.CommandUUID, len(r.ResultReport), r.RequestType, r.Completed, step.Commands[c].CommandUUID, len(bodies[c]))
				}
			}
		})
	}
}
