package collector

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// scriptedServer answers ServerIdentity from a script, then repeats the
// last answer.
type scriptedServer struct {
	mu     sync.Mutex
	script []string // "" for an error
	asked  int
	past   chan struct{} // closed when asked for the third time past the script's end
}

func (s *scriptedServer) ServerIdentity(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := s.script[min(s.asked, len(s.script)-1)]
	s.asked++
	if s.asked == len(s.script)+3 {
		close(s.past)
	}
	if id == "" {
		return "", errors.New("no answer")
	}
	return id, nil
}

// The watch calls onNew once for each server not seen before, after the
// first: the old primary and its promoted replica answering by turns (a
// pool whose connections reach both) count once, a failed question is not
// a change, and a third server is.
func TestWatchServerCallsOnNewOncePerServerNotSeenBefore(t *testing.T) {
	t.Parallel()
	srv := &scriptedServer{script: []string{"a:3306 server_id 1", "a:3306 server_id 1", "", "b:3306 server_id 2",
		"a:3306 server_id 1", "b:3306 server_id 2", "", "c:3306 server_id 3", "c:3306 server_id 3"}, past: make(chan struct{})}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	var changes []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		WatchServer(ctx, srv, time.Millisecond, zerolog.Nop(), func(from, to string) {
			mu.Lock()
			changes = append(changes, from+" -> "+to)
			mu.Unlock()
		})
	}()
	select {
	case <-srv.past: // every answer of the script, and the last twice more, seen
	case <-time.After(15 * time.Second):
		t.Error("the watch did not ask its way through the script within 15 s")
	}
	cancel()
	<-done
	want := []string{"a:3306 server_id 1 -> b:3306 server_id 2", "b:3306 server_id 2 -> c:3306 server_id 3"}
	mu.Lock()
	defer mu.Unlock()
	if len(changes) != len(want) || changes[0] != want[0] || changes[1] != want[1] {
		t.Fatalf("onNew calls %q, want %q", changes, want)
	}
}
