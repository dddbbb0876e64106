package main

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// A process that ignores SIGINT is killed after stopGrace, and stop
// returns: a run never stalls in silence on a binary that will not exit.
func TestStopKillsAProcessThatIgnoresSIGINT(t *testing.T) {
	defer func(g time.Duration) { stopGrace = g }(stopGrace)
	stopGrace = 300 * time.Millisecond
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	// the shell ignores SIGINT and leaves a child holding its output pipe,
	// as a wrapper script around a profiled binary can
	p, err := startProc(sh, nil, "-c", `trap "" INT; sleep 60 & echo started; wait`)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the trap is set
	start := time.Now()
	p.stop()
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("stop took %s for a process that ignores SIGINT, want it killed after %s", took, stopGrace)
	}
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("process state %v, want killed by SIGKILL", p.cmd.ProcessState)
	}
}

// A process that exits on SIGINT is not killed.
func TestStopWaitsForAProcessThatExitsOnSIGINT(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	p, err := startProc(sleep, nil, "60")
	if err != nil {
		t.Fatal(err)
	}
	p.stop()
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Fatalf("process state %v, want ended by SIGINT", p.cmd.ProcessState)
	}
}
