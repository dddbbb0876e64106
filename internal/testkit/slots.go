package testkit

// Test databases open at once on this machine, across every test process:
// go test runs packages side by side and t.Parallel tests within them, and
// every test database has a pool (PoolSize) and often services with pools
// of their own (ServicePoolSize) against one shared server whose
// max_connections (151 by default) no test may raise.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// DBSlots is how many tests may hold test databases at once on this
// machine (STEPCOLLECT_TEST_DB_SLOTS overrides it).
const DBSlots = 4

var held = struct {
	sync.Mutex
	by map[string]*slot // top-level test name → its slot
}{by: map[string]*slot{}}

type slot struct {
	f     *os.File
	users int
}

// holdDBSlot takes one of the machine's DBSlots for t's top-level test,
// waiting while all are taken, and gives it back when the last of that
// test's users ends. Subtests share their parent's slot, so a test never
// waits for a second slot while holding one (no deadlock).
func holdDBSlot(t testing.TB) {
	t.Helper()
	key := t.Name()
	if i := strings.IndexByte(key, '/'); i >= 0 {
		key = key[:i]
	}
	held.Lock()
	if s := held.by[key]; s != nil {
		s.users++
		held.Unlock()
		t.Cleanup(func() { release(key) })
		return
	}
	held.Unlock()

	f := acquire(t, filepath.Join(os.TempDir(), "stepcollect-test-db-slots"), EnvInt("STEPCOLLECT_TEST_DB_SLOTS", DBSlots))
	held.Lock()
	if s := held.by[key]; s != nil { // a parallel subtest took one meanwhile
		s.users++
		held.Unlock()
		syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	} else {
		held.by[key] = &slot{f: f, users: 1}
		held.Unlock()
	}
	t.Cleanup(func() { release(key) })
}

func release(key string) {
	held.Lock()
	defer held.Unlock()
	s := held.by[key]
	if s.users--; s.users == 0 {
		syscall.Flock(int(s.f.Fd()), syscall.LOCK_UN)
		s.f.Close()
		delete(held.by, key)
	}
}

// acquire locks one of n slot files in dir (flock: a process that dies
// gives its slot back), polling while every one is held elsewhere.
func acquire(t testing.TB, dir string, n int) *os.File {
	t.Helper()
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("test database slots: %v", err)
	}
	start := time.Now()
	warned := false
	for {
		for i := range n {
			f, err := tryLock(filepath.Join(dir, fmt.Sprint(i)))
			if err != nil {
				t.Fatalf("test database slot %d: %v", i, err)
			}
			if f != nil {
				return f
			}
		}
		if !warned && time.Since(start) > time.Minute {
			t.Logf("waiting for one of %d test database slots (%s) for %v", n, dir, time.Since(start).Round(time.Second))
			warned = true
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// tryLock opens (creating) the file at path and takes an exclusive flock
// on it without waiting: the file while this process holds it (a process
// that dies gives it back), nil if another holder has it.
func tryLock(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		return nil, err
	}
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		f.Close()
		return nil, nil
	}
	return f, nil
}
