package testkit_test

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
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

// The ports handed out for servers to listen on later are never ones the
// kernel may give an outgoing connection meanwhile: below the ephemeral
// range, and spread over it. (That a picked port is free is
// TestPickFreeSkipsPortsInUse's: listening on it again here would race
// every other test process on the machine, which CI runs at once; one did
// take a picked port in between.)
func TestPickPortStaysOutOfTheEphemeralRange(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		t.Fatalf("reading the ephemeral range: %v", err)
	}
	f := strings.Fields(string(b))
	first, err := strconv.Atoi(f[0])
	if err != nil || len(f) != 2 {
		t.Fatalf("ip_local_port_range %q: %v", b, err)
	}
	seen := map[int]bool{}
	for range 100 {
		port, err := testkit.PickPort()
		if err != nil {
			t.Fatal(err)
		}
		if port < 10000 || port >= first {
			t.Fatalf("picked %d, want in 10000–%d (below the ephemeral range %s)", port, first-1, strings.TrimSpace(string(b)))
		}
		seen[port] = true
	}
	if len(seen) < 90 {
		t.Errorf("100 picks gave %d distinct ports: not spread over the range", len(seen))
	}
}
