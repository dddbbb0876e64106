package testkit

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// Two slots: a third taker waits until one is given back, and a slot held
// by another process (flock is per open file, as across processes) counts.
func TestADBSlotIsWaitedForUntilOneIsGivenBack(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := acquire(t, dir, 2)
	b := acquire(t, dir, 2)
	got := make(chan struct{})
	go func() {
		f := acquire(t, dir, 2)
		f.Close()
		close(got)
	}()
	select {
	case <-got:
		t.Fatal("a third slot was taken while both were held")
	case <-time.After(300 * time.Millisecond):
	}
	syscall.Flock(int(a.Fd()), syscall.LOCK_UN)
	a.Close()
	select {
	case <-got:
	case <-time.After(15 * time.Second):
		t.Fatal("no slot within 15 s of one being given back")
	}
	b.Close()

	// another process holds both: flock(1) from util-linux
	if _, err := exec.LookPath("flock"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("flock (util-linux) is required under CI: %v", err)
		}
		t.Skip("no flock command")
	}
	hold := exec.Command("bash", "-c", "exec 3>"+dir+"/0 4>"+dir+"/1; flock 3; flock 4; echo held; sleep 30")
	out, _ := hold.StdoutPipe()
	if err := hold.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { hold.Process.Kill(); hold.Wait() }()
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil {
		t.Fatal(err)
	}
	taken := make(chan struct{})
	go func() { acquire(t, dir, 2).Close(); close(taken) }()
	select {
	case <-taken:
		t.Fatal("a slot another process holds was taken")
	case <-time.After(300 * time.Millisecond):
	}
	hold.Process.Kill()
	select {
	case <-taken:
	case <-time.After(15 * time.Second):
		t.Fatal("no slot within 15 s of the other process ending")
	}
}
