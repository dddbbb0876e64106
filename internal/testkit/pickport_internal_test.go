package testkit

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// listening returns a port the kernel gave a listener of its own, kept
// open until t ends if keep, else closed at once (free again).
func listening(t *testing.T, keep bool) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if keep {
		t.Cleanup(func() { ln.Close() })
	} else {
		ln.Close()
	}
	return ln.Addr().(*net.TCPAddr).Port
}

// A port something listens on is never picked: with every candidate but
// one held by this test, the free one is what comes back, and with all of
// them held the pick fails saying so.
func TestPickFreeSkipsPortsInUse(t *testing.T) {
	var held []int
	for range 3 {
		held = append(held, listening(t, true))
	}
	free := listening(t, false)

	// The held ones come first, twice over, then the free one.
	cands := append(append(append([]int{}, held...), held...), free)
	i := 0
	next := func() int { p := cands[i%len(cands)]; i++; return p }
	got, err := pickFree(next, len(cands))
	if err != nil {
		t.Fatalf("pickFree over %v (free %d): %v", cands, free, err)
	}
	if got != free {
		t.Fatalf("picked %d, want %d, the only one not held (held %v)", got, free, held)
	}

	i = 0
	_, err = pickFree(next, len(held))
	if err == nil || !strings.Contains(err.Error(), "every one in use") {
		t.Fatalf("with every candidate held, err = %v, want one saying every one is in use", err)
	}
}

// A port another process picked is not picked again, though nothing
// listens on it yet: its lock file is held (here through a second open
// file description, which flock treats as another holder, as it would
// another process).
func TestPickFreeSkipsPortsAnotherProcessPicked(t *testing.T) {
	taken, free := listening(t, false), listening(t, false)
	dir := filepath.Join(os.TempDir(), "stepcollect-test-ports")
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(taken)), os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatalf("locking port %d as another process would: %v", taken, err)
	}

	cands := []int{taken, taken, free}
	i := 0
	got, err := pickFree(func() int { p := cands[i]; i++; return p }, len(cands))
	if err != nil || got != free {
		t.Fatalf("pickFree over %v = %d, %v; want %d: %d is another's, though nothing listens on it", cands, got, err, free, taken)
	}
	// Picked once, this process does not hand it out twice either.
	i = 2
	if got, err := pickFree(func() int { p := cands[i]; i++; return p }, 1); err == nil {
		t.Fatalf("pickFree handed out %d a second time", got)
	}
}
