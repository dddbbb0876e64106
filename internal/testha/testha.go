// Package testha starts the highly available setups stepcollect runs on,
// as private processes for one test: a Redis primary with a replica and
// Sentinels (sentinel.go), and a MariaDB server of the test's own
// (mariadb.go), whose GLOBAL settings the test may change without touching
// the shared server. Everything listens on 127.0.0.1, on free ports, keeps
// its files in the test's temporary directory and is killed when the test
// ends.
//
// A missing binary skips the test, except under CI=true, where it fails:
// CI must never pass by skipping (.ci/run installs them).
package testha

import (
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Require skips t (fails it under CI=true) unless every binary is on PATH.
func Require(t testing.TB, bins ...string) {
	t.Helper()
	for _, b := range bins {
		if _, err := exec.LookPath(b); err != nil {
			if os.Getenv("CI") == "true" {
				t.Fatalf("%s is required under CI (CI=true): %v", b, err)
			}
			t.Skipf("%s not installed: %v", b, err)
		}
	}
}

// freePort returns a 127.0.0.1 port free right now.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// awaitTCP waits until addr accepts a connection, or while alive says the
// process still runs, up to within.
func awaitTCP(addr string, within time.Duration, alive func() bool) bool {
	deadline := time.Now().Add(within)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return true
		}
		if !alive() || time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// process is one child process with its output kept.
type process struct {
	name string
	bin  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logs *logBuffer
}

func newProcess(name, bin string, args ...string) *process {
	return &process{name: name, bin: bin, args: args, logs: &logBuffer{}}
}

func (p *process) start() error {
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = p.logs, p.logs
	// its own process group: a SIGINT for the test binary is not its
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	return nil
}

// running reports whether the process was started and has not exited.
func (p *process) running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// signal sends sig to the process, if it runs.
func (p *process) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if cmd != nil && p.running() {
		cmd.Process.Signal(sig)
	}
}

// stop sends sig and waits up to within for the exit, then SIGKILLs.
func (p *process) stop(sig syscall.Signal, within time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(within):
		cmd.Process.Kill()
		<-done
	}
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
