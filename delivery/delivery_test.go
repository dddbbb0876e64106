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
	"github.com/stepcollect/stepcollect/tasks"
)

// fakeStore holds one event.
type fakeStore struct {
	mu      sync.Mutex
	acked   bool
	failAt  time.Time
	reason  string
	claimed int
}

func (f *fakeStore) ClaimEvent(_ context.Context, id int64, _ time.Duration) (*storage.OutboxEvent, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.claimed++
	return &storage.OutboxEvent{OutboxRef: storage.OutboxRef{ID: id, EventID: "ev-1", Type: "step.completed", Attempts: f.claimed},
		Payload: []byte(`{"event_id":"ev-1"}`)}, nil
}
func (f *fakeStore) AckEvent(context.Context, int64) error { f.acked = true; return nil }
func (f *fakeStore) FailEvent(_ context.Context, _ int64, reason string, at time.Time) error {
	f.reason, f.failAt = reason, at
	return nil
}

func deliverTask(t *testing.T) func(d *delivery.Deliverer) error {
	task, _, err := tasks.NewDeliverTask(storage.OutboxRef{ID: 7, EventID: "ev-1", Type: "step.completed"})
	if err != nil {
		t.Fatal(err)
	}
	return func(d *delivery.Deliverer) error { return d.ProcessTask(context.Background(), task) }
}

// A deliver task (left by an older build) whose POST fails hands the event
// to the dispatcher: the failure is recorded with a short lease, and asynq
// is not asked to retry (nothing is archived).
func TestAFailedDeliverTaskLeavesTheEventToTheDispatcher(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(delivery.SignatureHeader) != delivery.Sign([]byte("k"), []byte(`{"event_id":"ev-1"}`)) ||
			r.Header.Get(delivery.EventIDHeader) != "ev-1" {
			http.Error(w, "unsigned", http.StatusUnauthorized)
			return
		}
		http.Error(w, "nope", http.StatusBadGateway)
	}))
	defer srv.Close()
	st := &fakeStore{}
	m := metrics.NewDelivery(prometheus.NewRegistry(), "step.completed")
	d := delivery.New(delivery.Config{URL: srv.URL, HMACKey: []byte("k")}, st, m, zerolog.Nop())
	if err := deliverTask(t)(d); err != nil {
		t.Fatalf("the task returned %v: asynq would retry or archive it", err)
	}
	if st.acked || st.reason != "callback answered 502 Bad Gateway" || time.Until(st.failAt) > 2*time.Second {
		t.Errorf("acked=%v reason=%q offered again in %v, want within 2s", st.acked, st.reason, time.Until(st.failAt))
	}
	if got := testutil.ToFloat64(m.Deliveries.WithLabelValues("step.completed", "http_error")); got != 1 {
		t.Errorf("http_error deliveries %v", got)
	}
}

func TestANoAnswerIsATimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer srv.Close()
	defer close(release)
	st := &fakeStore{}
	m := metrics.NewDelivery(prometheus.NewRegistry(), "step.completed")
	d := delivery.New(delivery.Config{URL: srv.URL, Timeout: 200 * time.Millisecond}, st, m, zerolog.Nop())
	deliverTask(t)(d)
	if got := testutil.ToFloat64(m.Deliveries.WithLabelValues("step.completed", "timeout")); got != 1 || st.acked {
		t.Errorf("timeouts %v, acked %v", got, st.acked)
	}
}

func TestWithoutACallbackURLEventsWait(t *testing.T) {
	st := &fakeStore{}
	d := delivery.New(delivery.Config{}, st, metrics.NewDelivery(prometheus.NewRegistry()), zerolog.Nop())
	if err := deliverTask(t)(d); err != nil || st.claimed != 0 {
		t.Errorf("err %v, claimed %d: want the event left untouched", err, st.claimed)
	}
}

func TestRetryDelaysGrowAndAreBounded(t *testing.T) {
	prev := time.Duration(0)
	for n := range 20 {
		d := tasks.DeliverRetryDelay(n)
		if d < prev || d > 2*time.Minute || d <= 0 {
			t.Fatalf("delay %d = %v after %v", n, d, prev)
		}
		prev = d
	}
}

// A 302 to a URL whose GET answers 200 is not a delivery: nobody received
// the body. The event stays, and the failure names the Location.
func TestARedirectIsAFailedDeliveryNotFollowed(t *testing.T) {
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
	st := &fakeStore{}
	m := metrics.NewDelivery(prometheus.NewRegistry(), "step.completed")
	d := delivery.New(delivery.Config{URL: srv.URL + "/events"}, st, m, zerolog.Nop())
	if err := deliverTask(t)(d); err != nil {
		t.Fatalf("last attempt: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if st.acked {
		t.Fatal("the event was acknowledged (and so deleted) after a redirect")
	}
	if gets+posts != 0 {
		t.Errorf("the redirect was followed: %d GETs, %d POSTs to its Location", gets, posts)
	}
	if want := `callback answered 302 Found with Location "/moved"`; len(st.reason) < len(want) || st.reason[:len(want)] != want {
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
	srv := httptest.NewServer(http.NotFoundHandler())
	host := srv.Listener.Addr().String()
	srv.Close() // nothing listens there any more
	var logs bytes.Buffer
	st := &fakeStore{}
	d := delivery.New(delivery.Config{URL: "http://cbuser:S3cretPw@" + host + "/cb"}, st,
		metrics.NewDelivery(prometheus.NewRegistry(), "step.completed"), zerolog.New(&logs))
	deliverTask(t)(d)
	if st.acked || !strings.Contains(st.reason, host) {
		t.Fatalf("acked %v, reason %q: want a failure naming %s", st.acked, st.reason, host)
	}
	for _, secret := range []string{"S3cretPw", "cbuser"} {
		if strings.Contains(st.reason, secret) || strings.Contains(logs.String(), secret) {
			t.Errorf("%q shows: reason %q, logs %s", secret, st.reason, logs.String())
		}
	}
}
