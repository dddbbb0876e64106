package app_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// gauge reads metric name from the /metrics of addr.
func gauge(t *testing.T, addr, name string) float64 {
	t.Helper()
	fams, err := scrape.Families("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if fams[name] == nil {
		t.Fatalf("%s does not export %s", addr, name)
	}
	return scrape.Value(fams, name)
}

// The operator's bad day, end to end through the api and a worker: an
// event the receiver always refuses is held after -max-delivery-attempts
// (the others delivered), shown by GET /v1/events?state=held and by
// stepcollect_outbox_held on both binaries; released with POST
// /v1/events/{id}/deliver once the receiver is fixed, it is delivered once.
func TestAPoisonEventIsHeldListedCountedAndDeliveredByHand(t *testing.T) {
	rcv := testkit.NewReceiver(t, testkit.ReceiverOptions{HMACKey: callbackKey})
	poison := "bad-0002" // of testkit.V1FanOut("bad", 5)
	var refusing atomic.Bool
	var posts atomic.Int32
	refusing.Store(true)
	url := rcv.Poisoned(t, poison, &refusing, &posts)
	s := startService(t, url, func(c *app.WorkerConfig) { c.MaxDeliveryAttempts = 3 })
	step, ids := testkit.V1FanOut("bad", 5)
	s.client.MustEnqueue(t, step)
	s.answerAll(t, ids, "bad-CMD")

	var held map[string]any
	testkit.WaitUntil(t, 20*time.Second, "the poison event held (GET /v1/events?state=held)", func() (bool, any) {
		status, body := s.client.V1(t, "GET", "/v1/events?state=held", nil)
		evs, _ := body["events"].([]any)
		if status != http.StatusOK || len(evs) != 1 {
			_, all := s.client.V1(t, "GET", "/v1/events", nil)
			return false, []any{posts.Load(), rcv.Stats(), all}
		}
		held = evs[0].(map[string]any)
		return true, nil
	})
	if held["enrollment_id"] != poison || held["attempts"] != 3.0 || held["last_error"] != "callback answered 400 Bad Request" || held["state"] != "held" {
		t.Errorf("held event %v", held)
	}
	if n := rcv.Distinct(); n != 4 {
		t.Errorf("%d events delivered, want the 4 good ones", n)
	}
	for _, addr := range []string{s.worker, strings.TrimPrefix(s.client.URL, "http://")} {
		testkit.WaitUntil(t, 15*time.Second, "stepcollect_outbox_held 1 on "+addr, func() (bool, any) {
			v := gauge(t, addr, "stepcollect_outbox_held")
			return v == 1, v
		})
	}

	refusing.Store(false)
	status, body := s.client.V1(t, "POST", "/v1/events/"+held["event_id"].(string)+"/deliver", nil)
	if status != http.StatusAccepted {
		t.Fatalf("deliver: %d %v", status, body)
	}
	testkit.WaitUntil(t, 15*time.Second, "every event delivered and acknowledged: {distinct delivered, outbox rows}", func() (bool, any) {
		d := s.delivered(t, rcv)
		return d == [2]int{5, 0}, d
	})
	if n, p := rcv.Times(held["event_id"].(string)), posts.Load(); n != 1 || p != 4 {
		t.Errorf("the released event accepted %d times in %d posts, want once in 4", n, p)
	}
	rcv.Check(t)
}

// A pause through the api stops the worker (nothing posted over a window
// after it answered), shows in the worker's /readyz body while it stays
// ready, and in stepcollect_delivery_paused; a resume delivers everything.
func TestAPauseThroughTheAPIStopsTheWorkerAndShowsInReadinessAndMetrics(t *testing.T) {
	rcv := testkit.NewReceiver(t, testkit.ReceiverOptions{HMACKey: callbackKey})
	s := startService(t, rcv.URL, nil)
	if status, body := s.client.V1(t, "POST", "/v1/delivery/pause", nil); status != http.StatusOK || body["paused"] != true {
		t.Fatalf("pause: %d %v", status, body)
	}
	step, ids := testkit.V1FanOut("held", 20)
	s.client.MustEnqueue(t, step)
	s.answerAll(t, ids, "held-CMD")
	if _, moved := testkit.Watch(time.Now().Add(2*time.Second), func() bool { return rcv.Stats().Posts != 0 }); moved {
		t.Fatalf("delivered while paused: %v", rcv.Stats())
	}
	resp, err := http.Get("http://" + s.worker + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	ready, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(ready), "delivery: paused since ") {
		t.Errorf("worker /readyz while paused: %d %q, want 200 naming the pause", resp.StatusCode, ready)
	}
	testkit.WaitUntil(t, 15*time.Second, "stepcollect_delivery_paused 1 on the worker", func() (bool, any) {
		v := gauge(t, s.worker, "stepcollect_delivery_paused")
		return v == 1, v
	})

	if status, body := s.client.V1(t, "POST", "/v1/delivery/resume", nil); status != http.StatusOK || body["paused"] != false {
		t.Fatalf("resume: %d %v", status, body)
	}
	testkit.WaitUntil(t, 15*time.Second, "every event delivered after the resume: {distinct delivered, outbox rows}", func() (bool, any) {
		d := s.delivered(t, rcv)
		return d == [2]int{len(ids), 0}, d
	})
	testkit.WaitUntil(t, 15*time.Second, "stepcollect_delivery_paused 0 on the worker", func() (bool, any) {
		v := gauge(t, s.worker, "stepcollect_delivery_paused")
		return v == 0, v
	})
	rcv.Check(t)
}
