package delivery_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/delivery"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
)

// oneEvent is an outbox of one event, offered to the dispatcher's first
// claim only, that records what the dispatcher made of its try.
type oneEvent struct {
	mu      sync.Mutex
	claimed int
	acked   bool
	failAt  time.Time
	reason  string
	settled chan struct{} // closed once the try is acknowledged, failed or held
}

func newOneEvent() *oneEvent { return &oneEvent{settled: make(chan struct{})} }

func (f *oneEvent) ClaimDueEvents(context.Context, int, time.Duration) ([]*storage.OutboxEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claimed++
	if f.claimed > 1 {
		return nil, nil
	}
	return []*storage.OutboxEvent{{OutboxRef: storage.OutboxRef{ID: 7, EventID: "ev-1", Type: "step.completed", Attempts: 1},
		Payload: []byte(`{"event_id":"ev-1"}`)}}, nil
}
func (f *oneEvent) RenewLeases(context.Context, []storage.OutboxRef, time.Duration) error { return nil }
func (f *oneEvent) AckEvents(context.Context, []storage.OutboxRef) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.acked = true
	close(f.settled)
	return nil
}
func (f *oneEvent) FailEvent(_ context.Context, _ storage.OutboxRef, reason string, at time.Time) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reason, f.failAt = reason, at
	close(f.settled)
	return nil
}
func (f *oneEvent) HoldEvent(context.Context, storage.OutboxRef, string) error {
	panic("held: no limit was configured")
}

// dispatchOne runs a dispatcher posting through d until the event's try
// settled, then stops it.
func dispatchOne(t *testing.T, d *delivery.Deliverer, st *oneEvent) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		delivery.NewDispatcher(delivery.DispatchConfig{Loops: 1, PollInterval: 10 * time.Millisecond}, d, st).Run(ctx)
		close(done)
	}()
	select {
	case <-st.settled:
	case <-time.After(15 * time.Second):
		t.Error("the try was neither acknowledged nor failed within 15s")
	}
	cancel()
	<-done // the dispatcher is done with st
}

// A POST answered 502 is a failed try: recorded with its answer and a
// backoff within the cap, never acknowledged, counted as an http_error.
// The body is signed and carries the event id.
func TestAFailedPostIsRecordedAndTriedAgainLater(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(delivery.SignatureHeader) != delivery.Sign([]byte("k"), []byte(`{"event_id":"ev-1"}`)) ||
			r.Header.Get(delivery.EventIDHeader) != "ev-1" {
			http.Error(w, "unsigned", http.StatusUnauthorized)
			return
		}
		http.Error(w, "nope", http.StatusBadGateway)
	}))
	defer srv.Close()
	st := newOneEvent()
	m := metrics.NewDelivery(prometheus.NewRegistry(), "step.completed")
	dispatchOne(t, delivery.New(delivery.Config{URL: srv.URL, HMACKey: []byte("k")}, m, zerolog.Nop()), st)
	if st.acked || st.reason != "callback answered 502 Bad Gateway" || time.Until(st.failAt) > 10*time.Second {
		t.Errorf("acked=%v reason=%q tried again in %v, want within the 10s backoff cap", st.acked, st.reason, time.Until(st.failAt))
	}
	if got := testutil.ToFloat64(m.Deliveries.WithLabelValues("step.completed", "http_error")); got != 1 {
		t.Errorf("http_error deliveries %v", got)
	}
}

func TestANoAnswerIsATimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	st := newOneEvent()
	m := metrics.NewDelivery(prometheus.NewRegistry(), "step.completed")
	dispatchOne(t, delivery.New(delivery.Config{URL: srv.URL, Timeout: 200 * time.Millisecond}, m, zerolog.Nop()), st)
	if got := testutil.ToFloat64(m.Deliveries.WithLabelValues("step.completed", "timeout")); got != 1 || st.acked {
		t.Errorf("timeouts %v, acked %v", got, st.acked)
	}
}

func TestWithoutACallbackURLEventsWait(t *testing.T) {
	t.Parallel()
	st := newOneEvent()
	d := delivery.New(delivery.Config{}, metrics.NewDelivery(prometheus.NewRegistry()), zerolog.Nop())
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	delivery.NewDispatcher(delivery.DispatchConfig{PollInterval: 10 * time.Millisecond}, d, st).Run(ctx)
	if st.claimed != 0 {
		t.Errorf("claimed %d times: want the event left untouched", st.claimed)
	}
}

// A 302 to a URL whose GET answers 200 is not a delivery: nobody received
// the body. The event stays, and the failure names the Location.
func TestARedirectIsAFailedDeliveryNotFollowed(t *testing.T) {
	t.Parallel()
	var gets, posts int
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.URL.Path == "/moved" && r.Method == http.MethodGet:
			gets++
			w.WriteHeader(http.StatusOK)
		case r.URL.Path == "/moved":
			posts++
			w.WriteHeader(http.StatusOK)
		default:
			http.Redirect(w, r, "/moved", http.StatusFound)
		}
	}))
	defer srv.Close()
	st := newOneEvent()
	m := metrics.NewDelivery(prometheus.NewRegistry(), "step.completed")
	dispatchOne(t, delivery.New(delivery.Config{URL: srv.URL + "/events"}, m, zerolog.Nop()), st)
	mu.Lock()
	defer mu.Unlock()
	if st.acked {
		t.Fatal("the event was acknowledged (and so deleted) after a redirect")
	}
	if gets+posts != 0 {
		t.Errorf("the redirect was followed: %d GETs, %d POSTs to its Location", gets, posts)
	}
	if want := `callback answered 302 Found with Location "/moved"`; !strings.HasPrefix(st.reason, want) {
		t.Errorf("failure recorded as %q, want it to start with %q", st.reason, want)
	}
	if got := testutil.ToFloat64(m.Deliveries.WithLabelValues("step.completed", "http_error")); got != 1 {
		t.Errorf("http_error deliveries %v, want 1", got)
	}
}

// A callback URL with credentials that cannot be reached: the failure
// recorded (the event's last_error) and logged names the host, never the
// user or password (net/http masks only the password).
func TestAFailedDeliveryShowsNoCallbackCredentials(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	host := srv.Listener.Addr().String()
	srv.Close() // nothing listens there any more
	var logs syncBuffer
	st := newOneEvent()
	d := delivery.New(delivery.Config{URL: "http://cbuser:S3cretPw@" + host + "/cb"},
		metrics.NewDelivery(prometheus.NewRegistry(), "step.completed"), zerolog.New(&logs))
	dispatchOne(t, d, st)
	if st.acked || !strings.Contains(st.reason, host) {
		t.Fatalf("acked %v, reason %q: want a failure naming %s", st.acked, st.reason, host)
	}
	if !strings.Contains(logs.String(), "delivery failed") {
		t.Errorf("the failure was not logged: %s", logs.String())
	}
	for _, secret := range []string{"S3cretPw", "cbuser"} {
		if strings.Contains(st.reason, secret) || strings.Contains(logs.String(), secret) {
			t.Errorf("%q shows: reason %q, logs %s", secret, st.reason, logs.String())
		}
	}
}

// syncBuffer is a bytes.Buffer the dispatcher's goroutines may log to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }
