package delivery_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/delivery"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// receiver counts the events it got, by event id.
type receiver struct {
	mu     sync.Mutex
	got    map[string]int
	posts  atomic.Int64
	status atomic.Int32 // answer; 0 means 200
}

func newReceiver(t *testing.T) (*receiver, *httptest.Server) {
	r := &receiver{got: map[string]int{}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.posts.Add(1)
		if s := r.status.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		var ev struct {
			EventID string `json:"event_id"`
		}
		if err := json.NewDecoder(req.Body).Decode(&ev); err != nil || ev.EventID != req.Header.Get(delivery.EventIDHeader) {
			http.Error(w, "bad event", 400)
			return
		}
		r.mu.Lock()
		r.got[ev.EventID]++
		r.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	return r, srv
}

func (r *receiver) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// completions writes n step.completed events to the outbox, the way the
// api does: n enrollments each completing its step.
func completions(t *testing.T, store *stepmysql.Storage, prefix string, n int) {
	t.Helper()
	ctx := t.Context()
	step := &nanostorage.StepEnqueuingWithConfig{}
	step.WorkflowName, step.InstanceID = "io.stepcollect.test."+prefix, prefix
	step.Commands = []nanostorage.StepCommandRaw{{CommandUUID: prefix + "-U", RequestType: "DeviceInformation"}}
	for i := range n {
		step.IDs = append(step.IDs, fmt.Sprintf("%s-%05d", prefix, i))
	}
	if err := store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, id := range step.IDs {
		_, err := store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, &nanostorage.StepCommandResult{
			CommandUUID: prefix + "-U", Completed: true, ResultReport: []byte("<plist/>")})
		if err != nil {
			t.Fatal(err)
		}
	}
}

func outboxStore(t *testing.T) (*testkit.DB, *stepmysql.Storage) {
	db := testkit.NewDB(t, nil)
	if err := stepmysql.Migrate(t.Context(), db.DB); err != nil {
		t.Fatal(err)
	}
	s, err := stepmysql.New(stepmysql.WithDB(db.DB), stepmysql.WithOutbox())
	if err != nil {
		t.Fatal(err)
	}
	return db, s
}

func outboxCount(t *testing.T, db *testkit.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM stepcollect_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func waitUntil(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func runDispatcher(t *testing.T, cfg delivery.DispatchConfig, url string, store delivery.DispatchStore) context.CancelFunc {
	d := delivery.New(delivery.Config{URL: url}, nil, metrics.NewDelivery(prometheus.NewRegistry(), "step.completed"), zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { delivery.NewDispatcher(cfg, d, store).Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return cancel
}

// Three dispatchers (three workers) on one outbox: every event arrives,
// none twice, and the outbox is empty afterwards.
func TestDispatchersDeliverEveryEventOnceBetweenThem(t *testing.T) {
	db, store := outboxStore(t)
	rcv, srv := newReceiver(t)
	completions(t, store, "disp", 600)
	for range 3 {
		runDispatcher(t, delivery.DispatchConfig{Batch: 16}, srv.URL, store)
	}
	waitUntil(t, 15*time.Second, "600 events delivered", func() bool { return rcv.distinct() == 600 })
	waitUntil(t, 15*time.Second, "the outbox emptied", func() bool { return outboxCount(t, db) == 0 })
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for id, n := range rcv.got {
		if n != 1 {
			t.Errorf("event %s delivered %d times with healthy workers", id, n)
		}
	}
}

// A worker that claimed events and died never acknowledges them: another
// worker delivers them once the lease lapses, under the same event ids.
func TestEventsADeadWorkerHeldAreDeliveredWhenItsLeaseLapses(t *testing.T) {
	db, store := outboxStore(t)
	rcv, srv := newReceiver(t)
	completions(t, store, "dead", 20)
	// the dead worker: claims everything with a 1 s lease, then nothing
	held, err := store.ClaimDueEvents(t.Context(), 100, time.Second)
	if err != nil || len(held) != 20 {
		t.Fatalf("claimed %d, %v; want 20", len(held), err)
	}
	claimedAt := time.Now()
	runDispatcher(t, delivery.DispatchConfig{}, srv.URL, store)
	waitUntil(t, 15*time.Second, "the dead worker's 20 events delivered", func() bool { return rcv.distinct() == 20 })
	if took := time.Since(claimedAt); took < time.Second {
		t.Errorf("delivered %v after the claim, before its 1 s lease ran out", took)
	}
	rcv.mu.Lock()
	for _, ev := range held {
		if rcv.got[ev.EventID] != 1 {
			t.Errorf("event %s delivered %d times", ev.EventID, rcv.got[ev.EventID])
		}
	}
	rcv.mu.Unlock()
	waitUntil(t, 15*time.Second, "the outbox emptied", func() bool { return outboxCount(t, db) == 0 })
}

// A receiver that fails keeps the events (backing off, at most MaxBackoff
// apart); once it answers again they are delivered within seconds.
func TestAReceiverThatComesBackIsServedWithinTheBackoffCap(t *testing.T) {
	db, store := outboxStore(t)
	rcv, srv := newReceiver(t)
	rcv.status.Store(http.StatusServiceUnavailable)
	completions(t, store, "down", 10)
	runDispatcher(t, delivery.DispatchConfig{MaxBackoff: time.Second}, srv.URL, store)
	waitUntil(t, 15*time.Second, "failed tries", func() bool { return rcv.posts.Load() >= 20 })
	if n := outboxCount(t, db); n != 10 {
		t.Fatalf("%d events in the outbox while the receiver fails, want all 10", n)
	}
	back := time.Now()
	rcv.status.Store(0)
	waitUntil(t, 15*time.Second, "10 events delivered after the receiver came back", func() bool { return rcv.distinct() == 10 })
	if took := time.Since(back); took > 3*time.Second {
		t.Errorf("delivered %v after the receiver came back, want within the 1 s backoff cap (and a poll)", took)
	}
	waitUntil(t, 15*time.Second, "the outbox emptied", func() bool { return outboxCount(t, db) == 0 })
}
