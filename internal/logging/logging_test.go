package logging

import (
	"bytes"
	"os"
	"strings"
	"testing"
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
