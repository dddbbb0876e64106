package logging

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// Console logs to a file or a pipe carry no colour codes: an operator who
// runs `make run > log` reads plain text.
func TestConsoleLogsToAFileHaveNoColour(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "log")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := New(f, "info", "console")
	if err != nil {
		t.Fatal(err)
	}
	l.Warn().Str("step_id", "7").Msg("hello")
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("\x1b[")) || !strings.Contains(string(b), "hello") {
		t.Errorf("console log in a file: %q, want plain text", b)
	}
}

// asynq's loops log a failure each every second while Redis is down: past
// the burst, a period's warnings and errors are counted, and the count
// goes with the first line of the next period. Info lines pass.
func TestAsynqWarningsAndErrorsAreLimitedAndTheRestCounted(t *testing.T) {
	var buf bytes.Buffer
	now := time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)
	a := NewAsynq(zerolog.New(&buf))
	a.lim.now = func() time.Time { return now }
	for i := range 40 { // 10 s of four loops failing once a second
		if i%2 == 0 {
			a.Error("Dequeue error: dial tcp: connection refused")
		} else {
			a.Warn("Failed to write server state data")
		}
	}
	a.Info("Starting processing")
	now = now.Add(AsynqPeriod)
	a.Error("Dequeue error: dial tcp: connection refused")

	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		lines = append(lines, m)
	}
	if len(lines) != AsynqBurst+2 {
		t.Fatalf("%d lines, want the burst (%d), the info line and the next period's first:\n%s", len(lines), AsynqBurst, buf.String())
	}
	if lines[AsynqBurst]["message"] != "Starting processing" {
		t.Errorf("line %d: %v, want the info line, never limited", AsynqBurst, lines[AsynqBurst])
	}
	last := lines[len(lines)-1]
	if last["suppressed"] != float64(40-AsynqBurst) || last["level"] != "error" {
		t.Errorf("the next period's first line: %v, want suppressed %d", last, 40-AsynqBurst)
	}
	for _, l := range lines[:AsynqBurst] {
		if _, ok := l["suppressed"]; ok {
			t.Errorf("a line of the first burst counts suppressed lines: %v", l)
		}
	}
}
