// Package testha starts the highly available setups stepcollect runs on,
// as private processes for one test: a Redis primary with a replica and
// Sentinels (sentinel.go), and a MySQL-protocol server of the test's own
// (sqlserver.go), whose GLOBAL settings the test may change, and which it
// may kill, without touching the shared server: the machine's mariadbd
// (mariadb.go) or Oracle MySQL's mysqld from scripts/mysql.sh's chroot
// (mysql.go), whichever the suite runs on (SuiteKind). Everything listens
// on 127.0.0.1, on free ports, keeps its files in a temporary directory
// and is killed when the test ends. The bench starts its private MariaDB
// the same way, outside a test (RunMariaDB).
//
// A missing binary (or MySQL's chroot) skips the test, except under
// CI=true, where it fails: CI must never pass by skipping (.ci/run
// installs them, and `make test-mysql` brings up the chroot).
package testha

import (
	"os/exec"
	"sync"
	"syscall"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// awaitTCP waits until addr accepts a connection, or while alive says the
// process still runs, up to within.
func awaitTCP(addr string, within time.Duration, alive func() bool) bool {
	up := false
	testkit.Watch(time.Now().Add(within), func() bool {
		up = testkit.Dial(addr) == nil
		return up || !alive()
	})
	return up
}

// process is one child process with its output kept.
type process struct {
	name string
	bin  string
	args []string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logs *testkit.LogBuffer
}

func newProcess(name, bin string, args ...string) *process {
	return &process{name: name, bin: bin, args: args, logs: &testkit.LogBuffer{}}
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

// pid is the process id (0 before start).
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
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
