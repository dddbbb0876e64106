package delivery_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stepcollect/stepcollect/delivery"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

func heldEvents(t *testing.T, store *stepmysql.Storage) []storage.OutboxEntry {
	t.Helper()
	page, err := store.ListEvents(t.Context(), storage.EventHeld, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	return page.Events
}

// An event the receiver always refuses is held after MaxAttempts tries,
// and then not tried again, while the events beside it are delivered;
// released once the receiver accepts it, it is delivered once.
func TestAPoisonEventIsHeldAfterItsAttemptsAndDeliveredOnceReleased(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, nil)
	b.complete(t, "poison", 10)
	var refusing atomic.Bool
	var posts atomic.Int32
	refusing.Store(true)
	b.url = b.rcv.Poisoned(t, testkit.EnrollmentID("poison", 3), &refusing, &posts)
	b.start(t, delivery.DispatchConfig{MaxAttempts: 3, MaxBackoff: 100 * time.Millisecond})

	b.awaitDelivered(t, 9, "the 9 good events delivered")
	testkit.WaitUntil(t, 15*time.Second, "the poison event held", func() (bool, any) {
		h := heldEvents(t, b.store)
		return len(h) == 1, h
	})
	held := heldEvents(t, b.store)[0]
	if held.Attempts != 3 || held.LastError == nil || *held.LastError != "callback answered 400 Bad Request" || held.EnrollmentID == nil || *held.EnrollmentID != testkit.EnrollmentID("poison", 3) {
		t.Errorf("held event %+v, want 3 attempts and the receiver's 400", held)
	}
	// not tried again while held: ten times its backoff cap, and more polls
	if _, tried := testkit.Watch(time.Now().Add(time.Second), func() bool { return posts.Load() != 3 }); tried {
		t.Fatalf("a held event was tried again: %d posts, want 3", posts.Load())
	}

	refusing.Store(false)
	if done, err := b.store.ReleaseOrDeliverEvent(t.Context(), held.EventID); err != nil || done != stepmysql.EventReleased {
		t.Fatalf("release: %q, %v", done, err)
	}
	b.awaitDelivered(t, 10, "the released event delivered")
	b.awaitOutboxEmpty(t)
	if n := b.rcv.Times(held.EventID); n != 1 || posts.Load() != 4 {
		t.Errorf("released event accepted %d times in %d posts, want once in 4", n, posts.Load())
	}
	b.rcv.Check(t)
}

// An event older than MaxAge is held at its first failure, its attempts
// unused.
func TestAnEventOlderThanMaxAgeIsHeldAtItsNextFailure(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, &dispatchOpts{Refuse: http.StatusServiceUnavailable})
	store := b.store
	b.complete(t, "old", 1)
	b.start(t, delivery.DispatchConfig{MaxAttempts: 1000, MaxAge: time.Millisecond})
	testkit.WaitUntil(t, 15*time.Second, "the old event held", func() (bool, any) {
		h := heldEvents(t, store)
		return len(h) == 1, h
	})
	if h := heldEvents(t, store)[0]; h.Attempts != 1 {
		t.Errorf("held after %d attempts, want at its first failure", h.Attempts)
	}
}

// A pause stops two dispatchers: events written after it are not
// delivered over a window of many polls, and a resume delivers them all,
// each once.
func TestAPauseStopsEveryDispatcherAndAResumeDeliversEverything(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, nil)
	db, store, rcv := b.db, b.store, b.rcv
	for range 2 {
		b.start(t, delivery.DispatchConfig{Batch: 8})
	}
	b.complete(t, "before", 20)
	b.awaitDelivered(t, 20, "20 events delivered before the pause")

	if _, err := store.SetDeliveryPaused(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	posts := rcv.Stats().Posts
	completions(t, store, "paused", 30)
	// 2 s is 20 polls of each of the 8 loops
	if _, moved := testkit.Watch(time.Now().Add(2*time.Second), func() bool { return rcv.Stats().Posts != posts }); moved {
		t.Fatalf("delivered while paused: %+v", rcv.Stats())
	}
	if n := testkit.OutboxRows(t, db.DB); n != 30 {
		t.Fatalf("%d events in the outbox while paused, want 30", n)
	}

	if _, err := store.SetDeliveryPaused(t.Context(), false); err != nil {
		t.Fatal(err)
	}
	b.awaitDelivered(t, 50, "every event delivered after the resume")
	b.awaitOutboxEmpty(t)
	for id, n := range rcv.Redelivered() {
		t.Errorf("event %s delivered %d times", id, n)
	}
	rcv.Check(t)
}

// rawStatusReceiver answers every request with status, a raw status line
// (HTTP allows any byte in its reason), and counts the requests.
func rawStatusReceiver(t *testing.T, status string, posts *atomic.Int32) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					posts.Add(1)
					if _, err := io.WriteString(c, "HTTP/1.1 "+status+"\r\nContent-Length: 0\r\n\r\n"); err != nil {
						return
					}
				}
			}()
		}
	}()
	return "http://" + ln.Addr().String() + "/"
}

// A receiver whose status line is not UTF-8, or whose reason is cut
// mid-character at 1000 bytes, still has its failures recorded: the event
// backs off, is held at MaxAttempts and listed, with valid text.
func TestAStatusLineThatIsNotUTF8IsRecordedAndTheEventHeld(t *testing.T) {
	t.Parallel()
	for name, status := range map[string]string{
		"latin1":      "503 Serv\xe9ce Unavailable",
		"cut at 1000": "503 x" + strings.Repeat("é", 600),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, store := testkit.NewStorage(t, stepmysql.WithOutbox())
			completions(t, store, "raw", 1)
			var posts atomic.Int32
			url := rawStatusReceiver(t, status, &posts)
			startDispatcher(t, delivery.DispatchConfig{MaxAttempts: 3, MaxBackoff: 100 * time.Millisecond}, url, store, &syncBuffer{})
			testkit.WaitUntil(t, 15*time.Second, "the event held", func() (bool, any) {
				h := heldEvents(t, store)
				return len(h) == 1, posts.Load()
			})
			h := heldEvents(t, store)[0]
			if h.Attempts != 3 || h.LastError == nil || !utf8.ValidString(*h.LastError) || len(*h.LastError) > 1000 ||
				!strings.HasPrefix(*h.LastError, "callback answered 503 ") {
				t.Errorf("held event %+v (last_error %q), want 3 attempts and the receiver's 503 as valid UTF-8 of at most 1000 bytes", h, deref(h.LastError))
			}
			if n := posts.Load(); n != 3 {
				t.Errorf("%d posts, want 3", n)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
