package delivery_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/delivery"
	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// completions writes n step.completed events to the outbox, the way the
// api does: n enrollments each completing its step.
func completions(t *testing.T, store *stepmysql.Storage, prefix string, n int) {
	t.Helper()
	step := testkit.FanOut(prefix, n, 1)
	if err := store.StoreStep(t.Context(), step, time.Now()); err != nil {
		t.Fatal(err)
	}
	testkit.Complete(t, store, step, step.IDs...)
}

// dispatchBundle is what a dispatcher test works with: its own database
// with an outbox, a receiver that checks what it is sent, the URL the
// dispatchers post to, and the log every dispatcher it starts writes to.
type dispatchBundle struct {
	db    *testkit.DB
	store *stepmysql.Storage
	rcv   *testkit.Receiver
	// url is the receiver's, or the front's the options put before it; a
	// test may point it elsewhere before it starts a dispatcher
	url  string
	logs *syncBuffer
}

// dispatchOpts is how a test's bundle differs from the plain one.
type dispatchOpts struct {
	// Refuse is what the receiver answers at first (0: it takes every event).
	Refuse int
	// Front, if set, gets every POST before the receiver (b.rcv), which it
	// passes them on to or not.
	Front func(b *dispatchBundle, w http.ResponseWriter, r *http.Request)
	// ConnState, if set, watches the front's connections.
	ConnState func(net.Conn, http.ConnState)
}

// newDispatchBundle returns a fresh bundle; opts may be nil.
func newDispatchBundle(t *testing.T, opts *dispatchOpts) *dispatchBundle {
	t.Helper()
	if opts == nil {
		opts = &dispatchOpts{}
	}
	b := &dispatchBundle{logs: &syncBuffer{}}
	b.db, b.store = testkit.NewStorage(t, stepmysql.WithOutbox())
	b.rcv = testkit.NewReceiver(t, testkit.ReceiverOptions{CompletionsOnly: true})
	b.rcv.Refuse(opts.Refuse)
	b.url = b.rcv.URL
	if opts.Front != nil {
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { opts.Front(b, w, r) }))
		srv.Config.ConnState = opts.ConnState
		srv.Start()
		t.Cleanup(srv.Close)
		b.url = srv.URL
	}
	return b
}

// complete writes n step.completed events to b's outbox.
func (b *dispatchBundle) complete(t *testing.T, prefix string, n int) {
	t.Helper()
	completions(t, b.store, prefix, n)
}

// dispatcher is a running dispatcher.
type dispatcher struct {
	stop func()               // returns once the dispatcher has
	reg  *prometheus.Registry // its delivery metrics, as the worker's /metrics serves them
}

// start runs a dispatcher on b's outbox until the test ends.
func (b *dispatchBundle) start(t *testing.T, cfg delivery.DispatchConfig) *dispatcher {
	return b.startOn(t, cfg, b.store)
}

// startOn is start with store standing for b's outbox.
func (b *dispatchBundle) startOn(t *testing.T, cfg delivery.DispatchConfig, store delivery.DispatchStore) *dispatcher {
	return startDispatcher(t, cfg, b.url, store, b.logs)
}

// startDispatcher runs a dispatcher posting to url, logging to logs,
// until the test ends.
func startDispatcher(t *testing.T, cfg delivery.DispatchConfig, url string, store delivery.DispatchStore, logs *syncBuffer) *dispatcher {
	reg := prometheus.NewRegistry()
	d := delivery.New(delivery.Config{URL: url}, metrics.NewDelivery(reg, "step.completed"), zerolog.New(logs))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { delivery.NewDispatcher(cfg, d, store).Run(ctx); close(done) }()
	stop := func() { cancel(); <-done }
	t.Cleanup(stop)
	return &dispatcher{stop: stop, reg: reg}
}

// awaitDelivered waits until the receiver has n distinct events.
func (b *dispatchBundle) awaitDelivered(t *testing.T, n int, what string) {
	t.Helper()
	testkit.WaitUntil(t, 15*time.Second, what+" (distinct delivered)", func() (bool, any) {
		got := b.rcv.Distinct()
		return got == n, got
	})
}

// awaitOutboxEmpty waits until every event is acknowledged.
func (b *dispatchBundle) awaitOutboxEmpty(t *testing.T) {
	t.Helper()
	testkit.WaitUntil(t, 15*time.Second, "the outbox emptied (rows)", func() (bool, any) {
		n := testkit.OutboxRows(t, b.db.DB)
		return n == 0, n
	})
}

// awaitRefused waits until the receiver has refused n POSTs.
func (b *dispatchBundle) awaitRefused(t *testing.T, n int, within time.Duration) {
	t.Helper()
	testkit.WaitUntil(t, within, fmt.Sprintf("%d failed tries (refused so far)", n), func() (bool, any) {
		got := b.rcv.Stats().Refused
		return got >= n, got
	})
}

// awaitProbing waits until the dispatcher's log says it probes.
func (b *dispatchBundle) awaitProbing(t *testing.T) {
	t.Helper()
	testkit.WaitUntil(t, 15*time.Second, "the worker probing (its log)", func() (bool, any) {
		return strings.Contains(b.logs.String(), "trying one event at a time"), b.rcv.Stats()
	})
}

// gate holds each POST until size of them wait, or until total have
// arrived (every later one passes at once): a batch's POSTs overlap.
type gate struct {
	mu               sync.Mutex
	size, total      int
	waiting, arrived int
	open             chan struct{}
}

func newGate(size, total int) *gate {
	return &gate{size: size, total: total, open: make(chan struct{})}
}

func (g *gate) pass(ctx context.Context) {
	g.mu.Lock()
	g.arrived++
	g.waiting++
	open := g.open
	if g.waiting >= g.size || g.arrived >= g.total {
		close(open)
		g.open, g.waiting = make(chan struct{}), 0
	}
	g.mu.Unlock()
	select {
	case <-open:
	case <-ctx.Done():
	}
}

// probing is stepcollect_delivery_probing as reg serves it at this scrape.
func probing(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "stepcollect_delivery_probing" && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("stepcollect_delivery_probing is not exported")
	return 0
}

// Three dispatchers (three workers) on one outbox: every event arrives,
// none twice, and the outbox is empty afterwards.
func TestDispatchersDeliverEveryEventOnceBetweenThem(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, nil)
	b.complete(t, "disp", 600)
	for range 3 {
		b.start(t, delivery.DispatchConfig{Batch: 16})
	}
	b.awaitDelivered(t, 600, "600 events delivered")
	b.awaitOutboxEmpty(t)
	for id, n := range b.rcv.Redelivered() {
		t.Errorf("event %s delivered %d times with healthy workers", id, n)
	}
	b.rcv.Check(t)
}

// A worker that claimed events and died never acknowledges them: another
// worker delivers them once the lease lapses, under the same event ids.
func TestEventsADeadWorkerHeldAreDeliveredWhenItsLeaseLapses(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, nil)
	b.complete(t, "dead", 20)
	// the dead worker: claims everything with a 1 s lease, then nothing.
	// The lease runs from a time the claim reads inside its transaction,
	// so the clock starts before the call, not after it returns: CI once
	// saw a claim on MySQL return at least 23 ms after its lease began.
	claimStarted := time.Now()
	held, err := b.store.ClaimDueEvents(t.Context(), 100, time.Second)
	if err != nil || len(held) != 20 {
		t.Fatalf("claimed %d, %v; want 20", len(held), err)
	}
	b.start(t, delivery.DispatchConfig{})
	b.awaitDelivered(t, 20, "the dead worker's 20 events delivered")
	if took := time.Since(claimStarted); took < time.Second {
		t.Errorf("delivered %v after the claim began, before its 1 s lease ran out", took)
	}
	for _, ev := range held {
		if n := b.rcv.Times(ev.EventID); n != 1 {
			t.Errorf("event %s delivered %d times", ev.EventID, n)
		}
	}
	b.awaitOutboxEmpty(t)
	b.rcv.Check(t)
}

// A receiver that fails keeps the events (backing off, at most MaxBackoff
// apart); once it answers again they are delivered within seconds.
func TestAReceiverThatComesBackIsServedWithinTheBackoffCap(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, &dispatchOpts{Refuse: http.StatusServiceUnavailable})
	b.complete(t, "down", 10)
	b.start(t, delivery.DispatchConfig{MaxBackoff: time.Second})
	b.awaitRefused(t, 20, 15*time.Second)
	if n := testkit.OutboxRows(t, b.db.DB); n != 10 {
		t.Fatalf("%d events in the outbox while the receiver fails, want all 10", n)
	}
	back := time.Now()
	b.rcv.Refuse(0)
	b.awaitDelivered(t, 10, "10 events delivered after the receiver came back")
	if took := time.Since(back); took > 3*time.Second {
		t.Errorf("delivered %v after the receiver came back, want within the 1 s backoff cap (and a poll)", took)
	}
	b.awaitOutboxEmpty(t)
	b.rcv.Check(t)
}

// lateRenewals is a store whose lease renewals never land, as when the
// database answers them later than a lease.
type lateRenewals struct{ *stepmysql.Storage }

func (lateRenewals) RenewLeases(context.Context, []storage.OutboxRef, time.Duration) error {
	return nil
}

// stillDelivering is what a worker logs when a claim returns an event one
// of its loops is posting.
const stillDelivering = "claimed an event this worker is still delivering"

// An event whose lease lapses while its POST runs (the renewals late) is
// claimed again by another loop of the same worker, which does not POST it
// a second time: one worker never delivers one event twice at once.
func TestAWorkerNeverPostsAnEventItIsStillDelivering(t *testing.T) {
	t.Parallel()
	var posts atomic.Int32
	b := newDispatchBundle(t, &dispatchOpts{Front: func(b *dispatchBundle, w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		// answers once a loop has claimed the event again (its lease
		// lapsed) and let it be
		testkit.Watch(time.Now().Add(15*time.Second), func() bool { return strings.Contains(b.logs.String(), stillDelivering) })
		b.rcv.ServeHTTP(w, r)
	}})
	b.complete(t, "own", 1)
	const lease = 300 * time.Millisecond
	b.startOn(t, delivery.DispatchConfig{Lease: lease, PollInterval: 20 * time.Millisecond}, lateRenewals{b.store})
	b.awaitDelivered(t, 1, "the event delivered")
	b.awaitOutboxEmpty(t)
	if !strings.Contains(b.logs.String(), stillDelivering) {
		t.Errorf("no claim returned the event while it was posted (the log has no %q): nothing was tested", stillDelivering)
	}
	if n := posts.Load(); n != 1 {
		t.Errorf("the event was posted %d times by one worker, want 1: its lease lapsed and another loop posted it again", n)
	}
	b.rcv.Check(t)
}

// claimClock is a store that records when each of its claims began.
type claimClock struct {
	*stepmysql.Storage
	mu     sync.Mutex
	starts []time.Time
}

func (c *claimClock) ClaimDueEvents(ctx context.Context, n int, lease time.Duration) ([]*storage.OutboxEvent, error) {
	c.mu.Lock()
	c.starts = append(c.starts, time.Now())
	c.mu.Unlock()
	return c.Storage.ClaimDueEvents(ctx, n, lease)
}

// since is how many claims began after at.
func (c *claimClock) since(at time.Time) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, s := range c.starts {
		if s.After(at) {
			n++
		}
	}
	return n
}

// An event answered at once is acknowledged then, not when the slowest
// POST of its batch returns: with a second worker polling, a receiver that
// answers one event after more than a lease never sees the fast one twice.
func TestAnAcknowledgedEventIsNotDeliveredAgainWhileItsBatchIsSlow(t *testing.T) {
	t.Parallel()
	slow := testkit.EnrollmentID("lap", 1)
	const lease = time.Second
	var started atomic.Int32
	second := &claimClock{}
	// answers the slow enrollment's event once the second worker's loops
	// have each claimed twice after a lease from its start (what would
	// have lapsed by then is theirs to take), the other at once
	b := newDispatchBundle(t, &dispatchOpts{Front: func(b *dispatchBundle, w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev events.Event
		if json.Unmarshal(body, &ev) == nil && len(ev.Step.IDs) == 1 && ev.Step.IDs[0] == slow {
			lapsed := time.Now().Add(lease)
			started.Add(1)
			testkit.Watch(lapsed.Add(15*time.Second), func() bool { return second.since(lapsed) >= 2*4 })
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		b.rcv.ServeHTTP(w, r)
	}})
	second.Storage = b.store
	b.complete(t, "lap", 2)

	b.start(t, delivery.DispatchConfig{Lease: lease})
	testkit.WaitUntil(t, 15*time.Second, "both events claimed in one batch (fast delivered, slow in flight)", func() (bool, any) {
		n := b.rcv.Distinct()
		return n == 1 && started.Load() == 1, n
	})
	// a second worker: it takes whatever lease lapses
	b.startOn(t, delivery.DispatchConfig{Lease: lease}, second)
	b.awaitDelivered(t, 2, "both events delivered")
	b.awaitOutboxEmpty(t)
	for id, n := range b.rcv.Redelivered() {
		t.Errorf("event %s delivered %d times; it was acknowledged with its first 2xx", id, n)
	}
	if n := started.Load(); n != 1 {
		t.Errorf("the slow event was posted %d times, want 1 (its lease is renewed while it runs)", n)
	}
	b.rcv.Check(t)
}

// A worker keeps its connections to the receiver open between batches: at
// most Loops x Batch POSTs run at once, and that many connections are all
// it ever opens. A connection closed after its POST is a new TCP (and, to
// an https receiver, TLS) handshake for the next one, on both sides; the
// transport's idle pool, smaller than the POSTs in flight, closed most of
// them after every round (a profile of the worker: 14% of its CPU in
// dialling).
func TestAWorkerReusesItsConnectionsToTheReceiver(t *testing.T) {
	t.Parallel()
	const loops, batch, rounds = 4, 32, 4
	var opened atomic.Int32
	g := newGate(batch, loops*batch*rounds) // a batch's POSTs overlap
	b := newDispatchBundle(t, &dispatchOpts{
		Front: func(b *dispatchBundle, w http.ResponseWriter, r *http.Request) {
			g.pass(r.Context())
			b.rcv.ServeHTTP(w, r)
		},
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				opened.Add(1)
			}
		},
	})
	b.complete(t, "conns", loops*batch*rounds)
	b.start(t, delivery.DispatchConfig{Loops: loops, Batch: batch})
	b.awaitDelivered(t, loops*batch*rounds, "every event delivered")
	b.awaitOutboxEmpty(t)
	if n := opened.Load(); n > loops*batch {
		t.Errorf("the worker opened %d connections to the receiver for %d events, at most %d POSTs at once: it closed connections between batches and dialled again", n, loops*batch*rounds, loops*batch)
	}
	t.Logf("%d connections for %d events (%d loops of %d)", opened.Load(), loops*batch*rounds, loops, batch)
	b.rcv.Check(t)
}

// Every loop's whole batch is in flight at once, whatever the other loops
// are posting: the goroutines POSTs run on are Loops × Batch, so a loop
// never waits for a POST of another's. The receiver answers nothing until
// every event is in flight (or 10 s have passed).
func TestEveryLoopPostsItsWholeBatchAtOnce(t *testing.T) {
	t.Parallel()
	const loops, batch = 2, 4
	var inflight, most atomic.Int32
	all := make(chan struct{})
	var once sync.Once
	b := newDispatchBundle(t, &dispatchOpts{Front: func(b *dispatchBundle, w http.ResponseWriter, r *http.Request) {
		n := inflight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		if n == loops*batch {
			once.Do(func() { close(all) })
		}
		select {
		case <-all:
		case <-time.After(10 * time.Second):
		}
		inflight.Add(-1)
		b.rcv.ServeHTTP(w, r)
	}})
	b.complete(t, "atonce", loops*batch)
	// one claim a loop takes every event: the loops' first claims split
	// them, a batch each (SKIP LOCKED, then the lease)
	b.start(t, delivery.DispatchConfig{Loops: loops, Batch: batch})
	b.awaitDelivered(t, loops*batch, "every event delivered")
	b.awaitOutboxEmpty(t)
	if m := most.Load(); m != loops*batch {
		t.Errorf("at most %d POSTs were in flight at once, want %d (%d loops of %d): a loop waited for another's POSTs", m, loops*batch, loops, batch)
	}
	b.rcv.Check(t)
}

// racingClaim is an outbox of one event whose second claim read it before
// the acknowledging DELETE and returns it after that DELETE and the release
// of the loop that posted it: a claim whose locking read came first (the
// DELETE waits for its COMMIT) on a machine where the claiming loop is
// scheduled late. Seen once in the service row at N=10000 on a starved
// machine: 10001 POSTs for 10000 events. Every claim after that one parks
// until the dispatcher stops, so that both loops parked means the claiming
// loop is done with the event.
type racingClaim struct {
	ev       storage.OutboxEvent
	mu       sync.Mutex
	n        int
	returned bool // the racing claim returned
	parked   int
	racing   chan struct{} // closed when the racing claim begins
	acked    chan struct{}
	once     sync.Once
}

func newRacingClaim() *racingClaim {
	return &racingClaim{ev: storage.OutboxEvent{OutboxRef: storage.OutboxRef{ID: 7, EventID: "ev-7", Type: "step.completed", Attempts: 1}, Payload: []byte(`{}`)},
		racing: make(chan struct{}), acked: make(chan struct{})}
}

func (f *racingClaim) ClaimDueEvents(ctx context.Context, _ int, _ time.Duration) ([]*storage.OutboxEvent, error) {
	f.mu.Lock()
	f.n++
	n, returned := f.n, f.returned
	if returned {
		f.parked++
	}
	f.mu.Unlock()
	switch {
	case returned:
		<-ctx.Done()
		return nil, ctx.Err()
	case n == 1:
		ev := f.ev
		return []*storage.OutboxEvent{&ev}, nil
	case n == 2:
		close(f.racing)
		select {
		case <-f.acked:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		// Places the race: the posting loop releases the event right
		// after its ack returns, and the dispatcher signals no release.
		time.Sleep(100 * time.Millisecond)
		f.mu.Lock()
		f.returned = true
		f.mu.Unlock()
		ev := f.ev
		return []*storage.OutboxEvent{&ev}, nil
	}
	return nil, nil
}

func (f *racingClaim) parkedLoops() int { f.mu.Lock(); defer f.mu.Unlock(); return f.parked }

func (f *racingClaim) RenewLeases(context.Context, []storage.OutboxRef, time.Duration) error {
	return nil
}
func (f *racingClaim) AckEvents(context.Context, []storage.OutboxRef) error {
	f.once.Do(func() { close(f.acked) })
	return nil
}
func (f *racingClaim) FailEvent(context.Context, storage.OutboxRef, string, time.Time) error {
	return nil
}
func (f *racingClaim) HoldEvent(context.Context, storage.OutboxRef, string) error { return nil }

// A claim that returns an event another loop of the same worker delivered
// and acknowledged while the claim ran does not POST it again.
func TestAWorkerDoesNotPostAgainWhatItAcknowledgedWhileAClaimRan(t *testing.T) {
	t.Parallel()
	f := newRacingClaim()
	var posts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		posts.Add(1)
		// answers once the other loop's claim has begun
		select {
		case <-f.racing:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	startDispatcher(t, delivery.DispatchConfig{Loops: 2, PollInterval: 10 * time.Millisecond}, srv.URL, f, &syncBuffer{})
	testkit.WaitUntil(t, 15*time.Second, "both loops claiming again after the racing claim (parked)", func() (bool, any) {
		n := f.parkedLoops()
		return n == 2, n
	})
	if n := posts.Load(); n != 1 {
		t.Errorf("the event was posted %d times by one worker, want 1: a claim that read it before its acknowledgement posted it again", n)
	}
}

// A receiver that hangs on some events holds their places and nothing
// else: with one loop, an event whose POST hung used to hold up every
// event claimed after it until the POST's 30 s timeout, and a loop for
// each hung event stopped delivery altogether. Here two POSTs hang until
// the end while twenty events written after them are delivered.
func TestAHangingPOSTHoldsUpNoOtherEvent(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var hanging atomic.Int32
	b := newDispatchBundle(t, &dispatchOpts{Front: func(b *dispatchBundle, w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev events.Event
		if json.Unmarshal(body, &ev) == nil && len(ev.Step.IDs) == 1 && strings.HasPrefix(ev.Step.IDs[0], "hang-") {
			hanging.Add(1)
			<-release
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		b.rcv.ServeHTTP(w, r)
	}})
	b.complete(t, "hang", 2)
	b.start(t, delivery.DispatchConfig{Loops: 1, Batch: 8, PollInterval: 20 * time.Millisecond})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before the dispatcher stops, which waits for its POSTs
	testkit.WaitUntil(t, 15*time.Second, "both hanging POSTs in flight (hanging)", func() (bool, any) {
		return hanging.Load() == 2, hanging.Load()
	})
	b.complete(t, "after", 20)
	b.awaitDelivered(t, 20, "the twenty events written while two POSTs hang")
	free()
	b.awaitDelivered(t, 22, "the two once their POSTs are answered")
	b.awaitOutboxEmpty(t)
	if n := hanging.Load(); n != 2 {
		t.Errorf("the hanging events were posted %d times, want 2 (their leases are renewed while they hang)", n)
	}
	b.rcv.Check(t)
}

// A receiver that is down fails every event, and every retry: the log has
// at most a few "will retry" lines a second per worker, not one per try
// (thousands a second), while the metric counts every one.
func TestFailedDeliveriesLogAFewLinesASecondNotOneEach(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, &dispatchOpts{Refuse: http.StatusServiceUnavailable})
	b.complete(t, "noisy", 200)
	start := time.Now()
	d := b.start(t, delivery.DispatchConfig{MaxBackoff: 100 * time.Millisecond})
	// every event tried once, at once (Loops x Batch places): without the
	// sampler that burst alone was a line each; and the tries after it,
	// retries and probes, for a second or so
	b.awaitRefused(t, 200, 15*time.Second)
	b.awaitRefused(t, 200+4, 15*time.Second)
	d.stop()
	secs := time.Since(start).Seconds()
	lines := strings.Count(b.logs.String(), "delivery failed; will retry")
	if max := int(5*(secs+1)) + 5; lines > max || lines == 0 {
		t.Errorf("%d \"will retry\" lines in %.1f s for %d failed tries, want at least one and at most %d", lines, secs, b.rcv.Stats().Refused, max)
	}
}

// A receiver that answers again after a run of failures has the events
// that failed meanwhile delivered at once, not each at the end of its
// backoff (up to the cap): the first success after the run ends them all.
func TestAReceiverThatAnswersAgainGetsTheFailedEventsAtOnce(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, &dispatchOpts{Refuse: http.StatusServiceUnavailable})
	b.complete(t, "back", 20)
	b.start(t, delivery.DispatchConfig{MaxBackoff: 8 * time.Second})
	// four tries each: the next is 4 to 8 s away
	b.awaitRefused(t, 80, 30*time.Second)
	back := time.Now()
	b.rcv.Refuse(0)
	b.complete(t, "fresh", 1) // tried at once, and taken
	b.awaitDelivered(t, 21, "21 events delivered after the receiver came back")
	if took := time.Since(back); took > 3*time.Second {
		t.Errorf("delivered %v after the receiver came back, want at once (the backoffs were 4 to 8 s)", took.Round(time.Millisecond))
	}
	b.awaitOutboxEmpty(t)
	b.rcv.Check(t)
}

// A receiver that fails every POST is probed, not sent every due event:
// after a run of failures the worker tries one event at a time, a few a
// second, instead of each of a thousand pending events every second or so
// (its backoff cap), each failure an UPDATE on the database. The first
// probe it takes ends the run, and every event is delivered within seconds.
func TestADownReceiverIsProbedNotSentEveryPendingEvent(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, &dispatchOpts{Refuse: http.StatusServiceUnavailable})
	b.complete(t, "probed", 1000)
	d := b.start(t, delivery.DispatchConfig{MaxBackoff: time.Second})
	b.awaitProbing(t)
	// an operator sees it on the worker's /metrics, as long as it lasts
	if got := probing(t, d.reg); got != 1 {
		t.Errorf("stepcollect_delivery_probing %v while the worker probes, want 1", got)
	}
	// the POSTs the dispatcher had taken before it began to probe end: some
	// are not yet sent when it logs, and nothing signals the last of them
	// (counted == received was seen true with 50 still to come, on MySQL)
	time.Sleep(time.Second)
	before := b.rcv.Stats().Refused
	linesBefore := strings.Count(b.logs.String(), "will retry")
	// a dozen probes, 3 s of them at 4 a second; a worker without the
	// brake sent each of the 1000 events about once a second (the 1 s
	// cap, jittered), thousands a second
	const probes = 12
	began := time.Now()
	b.awaitRefused(t, before+probes, 15*time.Second)
	window := time.Since(began)
	// while it probes, no line a failed probe: one now and then says so
	if n := strings.Count(b.logs.String(), "will retry") - linesBefore; n > 0 {
		t.Errorf("%d \"will retry\" lines while probing, want none (the probing lines say it)", n)
	}
	if n := strings.Count(b.logs.String(), "the receiver still fails"); n < 1 || n > 2 {
		t.Errorf("%d \"still fails\" lines in the first seconds of probing, want one (then one each 30 s)", n)
	}
	tries := b.rcv.Stats().Refused - before
	if max := int(8*window.Seconds()) + 8; tries > max {
		t.Errorf("%d POSTs to a receiver failing every one in %v, want a few probes a second (at most %d)", tries, window.Round(time.Millisecond), max)
	}
	if n := testkit.OutboxRows(t, b.db.DB); n != 1000 {
		t.Fatalf("%d events in the outbox while the receiver fails, want all 1000", n)
	}
	if got := probing(t, d.reg); got != 1 {
		t.Errorf("stepcollect_delivery_probing %v after %v more of probing, want 1", got, window.Round(time.Millisecond))
	}

	back := time.Now()
	b.rcv.Refuse(0)
	b.awaitDelivered(t, 1000, "1000 events delivered after the receiver came back")
	if took := time.Since(back); took > 5*time.Second {
		t.Errorf("delivered %v after the receiver came back, want within seconds (a probe, then everything due)", took.Round(time.Millisecond))
	}
	t.Logf("%d POSTs in %v to the receiver down; all 1000 events delivered %v after it came back", tries, window.Round(time.Millisecond), time.Since(back).Round(time.Millisecond))
	b.awaitOutboxEmpty(t)
	if got := probing(t, d.reg); got != 0 {
		t.Errorf("stepcollect_delivery_probing %v once the receiver answers again, want 0", got)
	}
	if n := strings.Count(b.logs.String(), "delivering at full rate"); n != 1 {
		t.Errorf("the receiver's return logged %d times, want once:\n%s", n, b.logs.String())
	}
	b.rcv.Check(t)
}

// A run of failed POSTs shorter than the brake's is not "probing": the
// worker still delivers at full rate, and the gauge an operator alerts on
// says so. The receiver fails the first 100 POSTs and holds every later
// one until the gauge is read, so the worker's streak stays at 100.
func TestAShortRunOfFailuresIsNotProbing(t *testing.T) {
	t.Parallel()
	const fails = 100 // fewer than the brake's 192
	var posts atomic.Int64
	release := make(chan struct{})
	b := newDispatchBundle(t, &dispatchOpts{Front: func(b *dispatchBundle, w http.ResponseWriter, req *http.Request) {
		if posts.Add(1) <= fails {
			http.Error(w, "handler failed", http.StatusServiceUnavailable)
			return
		}
		select {
		case <-release:
		case <-req.Context().Done():
			return
		}
		b.rcv.ServeHTTP(w, req)
	}})
	b.complete(t, "short", 300)
	d := b.start(t, delivery.DispatchConfig{MaxBackoff: time.Second})
	testkit.WaitUntil(t, 15*time.Second, "the first 100 POSTs counted as http_error", func() (bool, any) {
		n := deliveries(t, d.reg, "http_error")
		return n == fails, n
	})
	if got := probing(t, d.reg); got != 0 {
		t.Errorf("stepcollect_delivery_probing %v after %d failures in a row, want 0 (the worker probes after 192)", got, fails)
	}
	close(release)
	b.awaitDelivered(t, 300, "every event once the receiver answers")
	if strings.Contains(b.logs.String(), "trying one event at a time") {
		t.Errorf("a run of %d failures was taken for a receiver that is down:\n%s", fails, b.logs.String())
	}
	b.rcv.Check(t)
}

// deliveries is stepcollect_deliveries_total{outcome} as reg serves it
// (every outcome's if outcome is "").
func deliveries(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "stepcollect_deliveries_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && (outcome == "" || l.GetValue() == outcome) {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}

// A receiver that answers 400 to every event is up, judging them: it is
// not probed like one that is down, and every event keeps being tried on
// its own backoff (until held) rather than one every 250 ms.
func TestAReceiverRefusingEveryEventWith400IsNotTakenForDown(t *testing.T) {
	t.Parallel()
	b := newDispatchBundle(t, &dispatchOpts{Refuse: http.StatusBadRequest})
	b.complete(t, "judged", 300)
	d := b.start(t, delivery.DispatchConfig{MaxBackoff: time.Second})
	// two tries each, a second or so apart: a braked worker, 4 a second
	// after its first 192, would take over 100 s
	b.awaitRefused(t, 600, 30*time.Second)
	if got := probing(t, d.reg); got != 0 {
		t.Errorf("stepcollect_delivery_probing %v for a receiver answering 400, want 0", got)
	}
	if strings.Contains(b.logs.String(), "trying one event at a time") {
		t.Errorf("a receiver answering 400 was taken for down:\n%s", b.logs.String())
	}
}

// A receiver that fails one workflow's events (its handler answers 503)
// and takes the rest: once the worker is probing, a probe must find the
// events the receiver takes. Probes in claim order took the oldest due
// event each time, always the failing workflow's, and events of every
// other workflow waited for hours (an outside probe: 0 of 300 in 90 s).
func TestProbesFindTheEventsAReceiverTakesAmongOnesItFails(t *testing.T) {
	t.Parallel()
	var failed atomic.Int64
	b := newDispatchBundle(t, &dispatchOpts{Front: func(b *dispatchBundle, w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var ev events.Event
		if json.Unmarshal(body, &ev) == nil && strings.HasSuffix(ev.Step.WorkflowName, ".failing") {
			failed.Add(1)
			http.Error(w, "handler failed", http.StatusServiceUnavailable)
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		b.rcv.ServeHTTP(w, req)
	}})
	b.complete(t, "failing", 1000)
	b.start(t, delivery.DispatchConfig{})
	b.awaitProbing(t)
	start := time.Now()
	b.complete(t, "taken", 300)
	b.awaitDelivered(t, 300, "the 300 events the receiver takes, delivered among 1000 it fails")
	t.Logf("300 events delivered %v after they were written, among 1000 failing (%d failed POSTs in all)",
		time.Since(start).Round(time.Millisecond), failed.Load())
	testkit.WaitUntil(t, 15*time.Second, "only the 1000 failing events left in the outbox (rows)", func() (bool, any) {
		n := testkit.OutboxRows(t, b.db.DB)
		return n == 1000, n
	})
}

// A worker has at most MaxInflight POSTs in flight, on as many
// connections, whatever is due: a receiver that cannot take 256 at once
// (-max-delivery-inflight) gets no more than it was given. The same
// events to the default worker arrive many at once, so the bound, not the
// receiver, is what held them to it.
func TestMaxInflightBoundsThePOSTsAndConnectionsAtOnce(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name        string
		maxInflight int
	}{{"bounded", 4}, {"default", 0}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var now, peak atomic.Int64
			var mu sync.Mutex
			conns := map[string]bool{}
			b := newDispatchBundle(t, &dispatchOpts{Front: func(b *dispatchBundle, w http.ResponseWriter, req *http.Request) {
				n := now.Add(1)
				defer now.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				mu.Lock()
				conns[req.RemoteAddr] = true
				mu.Unlock()
				// a slow receiver, 100 ms a POST: what is due piles up
				// against the bound (the receiver's pace, not a wait)
				time.Sleep(100 * time.Millisecond)
				b.rcv.ServeHTTP(w, req)
			}})
			b.complete(t, "inflight-"+c.name, 60)
			b.start(t, delivery.DispatchConfig{MaxInflight: c.maxInflight})
			b.awaitDelivered(t, 60, "60 events delivered")
			mu.Lock()
			nconns := len(conns)
			mu.Unlock()
			switch {
			case c.maxInflight > 0 && (peak.Load() > int64(c.maxInflight) || nconns > c.maxInflight):
				t.Errorf("%d POSTs at once on %d connections, want at most %d", peak.Load(), nconns, c.maxInflight)
			case c.maxInflight > 0 && peak.Load() < 2:
				t.Errorf("%d POSTs at once, want up to %d (the bound used)", peak.Load(), c.maxInflight)
			case c.maxInflight == 0 && peak.Load() <= 4:
				t.Errorf("the default worker: %d POSTs at once, want many more than 4 (60 due, 100 ms each)", peak.Load())
			}
			t.Logf("%d POSTs at once at most, on %d connections", peak.Load(), nconns)
			b.rcv.Check(t)
		})
	}
}
