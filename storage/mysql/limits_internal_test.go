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
			ev := events.FromStepResult(1<<59, events.StepTimedOut, 1<<62, r, at)
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

// escapedOver answers as escapedLen would at every limit around a value's
// size, for values of nothing but bytes the driver escapes, of none, and
// of both; the length-only answer never says a value fits that does not.
func TestEscapedOverAgreesWithTheEscapedLength(t *testing.T) {
	t.Parallel()
	for _, b := range [][]byte{
		nil, []byte("plain text"), bytes.Repeat([]byte{'\''}, 100), bytes.Repeat([]byte("a\\b\"c\n\x00\x1a\r"), 50),
		append(bytes.Repeat([]byte{'x'}, 99), '\''),
	} {
		n := escapedLen(b)
		for _, limit := range []int{0, 1, len(b) - 1, len(b), len(b) + 1, n - 1, n, n + 1, 2*len(b) - 1, 2 * len(b), 2*len(b) + 1} {
			if limit < 0 {
				continue
			}
			if got, want := escapedOver(b, limit), n > limit; got != want {
				t.Errorf("%d bytes (%d escaped), limit %d: escapedOver says %v, want %v", len(b), n, limit, got, want)
			}
		}
	}
}

// The size check of a result, as the webhook runs it on each: a 4 KiB
// plist against the 16 MiB packet of MariaDB's default.
func BenchmarkEscapedSizeCheck(b *testing.B) {
	result := bytes.Repeat([]byte("<key>OSVersion</key>\n\t<string>17.1</string>\n"), 4096/45)
	limit := 16<<20 - stmtOverhead
	b.Run("escapedLen", func(b *testing.B) {
		b.SetBytes(int64(len(result)))
		for b.Loop() {
			if escapedLen(result) > limit {
				b.Fatal("over")
			}
		}
	})
	b.Run("escapedOver", func(b *testing.B) {
		b.SetBytes(int64(len(result)))
		for b.Loop() {
			if escapedOver(result, limit) {
				b.Fatal("over")
			}
		}
	})
}
