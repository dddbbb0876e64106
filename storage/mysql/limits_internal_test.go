package mysql

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/events"
)

// The size an event is checked by before it is built is never less than
// what its INSERT then carries, whatever its names hold: quotes,
// backslashes, HTML characters, control bytes, non-ASCII, invalid UTF-8.
func TestAnEventsSizeBoundIsNeverBelowItsEscapedJSON(t *testing.T) {
	t.Parallel()
	nasty := []string{"", "plain", `q"uo\te`, "<&>'", "tab\tnew\nline\x00\x1a", "é—☃\u2028", "\xff\xfe", strings.Repeat(`"`, 255)}
	at := time.Date(2038, 1, 19, 3, 14, 7, 999999999, time.UTC)
	for _, name := range nasty {
		for _, n := range []int{0, 1, 2, 3, 1000, 1 << 16} {
			blob := bytes.Repeat([]byte{'\n'}, n)
			r := &nanostorage.StepResult{IDs: []string{name + "-id"}}
			r.WorkflowName, r.InstanceID, r.Name, r.Context = name, name, name, blob
			var bound eventSize
			bound.step(name, name, name, len(blob))
			bound.id(name + "-id")
			for _, uuid := range []string{name + "-1", name + "-2"} {
				r.Commands = append(r.Commands, nanostorage.StepCommandResult{CommandUUID: uuid, RequestType: name, Completed: true, ResultReport: blob})
				bound.command(uuid, name, len(blob))
			}
			ev := events.FromStepResult(events.StepTimedOut, 1<<62, r, at)
			payload, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			if got := escapedLen(payload); got > int(bound) {
				t.Errorf("names %q, %d-byte blobs: the event takes %d bytes, its bound says %d", name, n, got, int(bound))
			}
		}
	}
}
