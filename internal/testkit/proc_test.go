package testkit_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// fatalRecorder is a testing.TB whose Fatalf records the message and ends
// the goroutine, as t.Fatalf does.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// A process that exits before it answers is reported at once, with its
// output, not after the whole wait.
func TestAwaitHTTPGivesUpWhenTheProcessExits(t *testing.T) {
	t.Parallel()
	p := testkit.StartProc(t, "/bin/sh", nil, "-c", "echo cannot start: no such database; exit 3")
	rec := &fatalRecorder{TB: t}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		testkit.AwaitHTTP(rec, p, "http://"+testkit.FreeAddr(t)+"/readyz", 60*time.Second)
	}()
	<-done
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("gave up after %v, want at once (within 15 s)", took)
	}
	if !strings.Contains(rec.msg, "exited: true") || !strings.Contains(rec.msg, "cannot start: no such database") {
		t.Errorf("failure %q, want it to say the process exited, with its output", rec.msg)
	}
}
