package testkit

// A private redis-server for one test, on a free port, so that the test can
// kill and restart it without touching the shared one.

import (
	"fmt"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Redis is a redis-server process owned by one test.
type Redis struct {
	t    testing.TB
	Port int
	URL  string // redis://127.0.0.1:<port>/0
	cmd  *exec.Cmd
	dir  string
}

// StartRedis starts a redis-server for t and stops it when t ends.
func StartRedis(t testing.TB) *Redis {
	t.Helper()
	RequireBinary(t, "redis-server")
	port := FreePort(t)
	s := &Redis{t: t, Port: port, URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port), dir: t.TempDir()}
	s.start()
	t.Cleanup(func() {
		if s.cmd != nil {
			s.cmd.Process.Kill()
			s.cmd.Wait()
		}
	})
	return s
}

func (s *Redis) start() {
	s.t.Helper()
	s.cmd = exec.Command("redis-server", "--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--daemonize", "no", "--loglevel", "warning")
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("starting redis-server: %v", err)
	}
	var err error
	if _, ok := Watch(time.Now().Add(10*time.Second), func() bool {
		err = Dial(fmt.Sprintf("127.0.0.1:%d", s.Port))
		return err == nil
	}); !ok {
		s.t.Fatalf("redis-server on port %d did not answer within 10s: %v", s.Port, err)
	}
}

// Kill stops the server with SIGKILL: no goodbye to its clients.
func (s *Redis) Kill() {
	s.t.Helper()
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}

// Restart starts the server again on the same port, empty.
func (s *Redis) Restart() {
	s.t.Helper()
	s.Kill()
	s.start()
}
