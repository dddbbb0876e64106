package app_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

const callbackKey = "callback-signing-key"

// receiver is a workflow engine's callback endpoint, written the way the
// README tells receivers to: verify the signature, deduplicate on event_id.
type receiver struct {
	srv       *httptest.Server
	mu        sync.Mutex
	byID      map[string]events.Event // deduplicated
	posts     int                     // every POST, duplicates included
	refuse    atomic.Bool             // answer 503 while set
	badSigned int
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{byID: map[string]events.Event{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		// the documented recipe: standard base64 of HMAC-SHA256 over the body
		mac := hmac.New(sha256.New, []byte(callbackKey))
		mac.Write(body)
		want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
		r.mu.Lock()
		defer r.mu.Unlock()
		r.posts++
		if !hmac.Equal([]byte(req.Header.Get("X-Stepcollect-Signature")), []byte(want)) {
			r.badSigned++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		if r.refuse.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		var ev events.Event
		if err := json.Unmarshal(body, &ev); err != nil || ev.EventID != req.Header.Get("X-Stepcollect-Event-Id") {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		r.byID[ev.EventID] = ev // a duplicate overwrites itself
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) distinct() map[string]events.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]events.Event, len(r.byID))
	for k, v := range r.byID {
		out[k] = v
	}
	return out
}

// service is an API and a worker, in process, on a fresh database and a
// private Redis, delivering to a receiver.
type service struct {
	db     *testkit.DB
	redis  *testkit.Redis
	apiURL string
}

func startService(t *testing.T, callbackURL string, mod func(*app.WorkerConfig)) *service {
	t.Helper()
	s := &service{db: testkit.NewDB(t, nil), redis: testkit.StartRedis(t)}
	logger := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })

	wcfg := app.WorkerConfig{
		MySQLDSN: s.db.DSN, RedisURL: s.redis.URL, Migrate: true, MetricsListen: "127.0.0.1:0", Concurrency: 8,
		SweepInterval: time.Second, ScheduleInterval: time.Second, CallbackURL: callbackURL, CallbackHMACKey: callbackKey,
		ShutdownTimeout: 2 * time.Second, MySQLMaxConns: 16,
	}
	if mod != nil {
		mod(&wcfg)
	}
	w, err := app.NewWorker(ctx, wcfg, logger)
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.NewAPI(ctx, app.APIConfig{
		MySQLDSN: s.db.DSN, RedisURL: s.redis.URL, Migrate: true, Listen: "127.0.0.1:0", APIKey: "k",
		MaxBodyBytes: 1 << 20, MySQLMaxConns: 32,
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	s.apiURL = "http://" + a.Addr()
	wg.Add(2)
	go func() { defer wg.Done(); w.Run(ctx) }()
	go func() { defer wg.Done(); a.Run(ctx) }()
	return s
}

func (s *service) enqueue(t *testing.T, step map[string]any) int64 {
	t.Helper()
	b, _ := json.Marshal(step)
	req, _ := http.NewRequest("POST", s.apiURL+"/v1/steps", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer k")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != 201 {
		t.Fatalf("enqueue: %d %v", resp.StatusCode, out)
	}
	return int64(out["step_id"].(float64))
}

func (s *service) answerAll(t *testing.T, ids []string, uuid string) {
	t.Helper()
	sender := webhook.New(s.apiURL + "/webhook")
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mdm.NewRequestWithContext(context.Background(), nil)
			r.EnrollID = &mdm.EnrollID{ID: id, Type: mdm.Device}
			raw := fmt.Appendf(nil, `<plist version="1.0"><dict><key>CommandUUID</key><string>%s</string><key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string></dict></plist>`, uuid, id)
			if _, err := sender.CommandAndReportResults(r, &mdm.CommandResults{Enrollment: mdm.Enrollment{UDID: id}, CommandUUID: uuid, Status: "Acknowledged", Raw: raw}); err != nil {
				t.Errorf("%s: %v", id, err)
			}
		}()
	}
	wg.Wait()
}

func fanOutRequest(name string, n int) (map[string]any, []string) {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%04d", name, i)
	}
	return map[string]any{
		"workflow_name": "io.example." + name, "instance_id": name, "ids": ids,
		"commands": []map[string]string{{"command_uuid": name + "-CMD", "request_type": "DeviceInformation"}},
	}, ids
}

// await polls cond until it holds or within passes.
func await(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, within)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func outboxRows(t *testing.T, s *service) int {
	t.Helper()
	return testkit.Count(t, s.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox`)
}

func TestEveryCompletionIsDeliveredSignedAndADedupingReceiverSeesExactlyN(t *testing.T) {
	rcv := newReceiver(t)
	s := startService(t, rcv.srv.URL, nil)
	step, ids := fanOutRequest("deliver", 200)
	stepID := s.enqueue(t, step)
	s.answerAll(t, ids, "deliver-CMD")

	await(t, 20*time.Second, "every event delivered and acknowledged", func() bool {
		return len(rcv.distinct()) == len(ids) && outboxRows(t, s) == 0
	})
	got := rcv.distinct()
	for _, id := range ids {
		ev, ok := got[events.ID(events.StepCompleted, stepID, id)]
		if !ok || ev.Type != events.StepCompleted || len(ev.Step.IDs) != 1 || ev.Step.IDs[0] != id ||
			!bytes.Contains(ev.Step.Commands[0].Result, []byte(id)) {
			t.Errorf("%s: event %+v", id, ev)
		}
	}
	if rcv.badSigned != 0 {
		t.Errorf("%d deliveries failed the signature check", rcv.badSigned)
	}
	t.Logf("%d POSTs for %d events", rcv.posts, len(ids))
}

// The receiver answers 503 for a while: nothing is lost, every event
// arrives once it accepts, and collection carries on meanwhile.
func TestReceiverDownForAWhileLosesNothingAndDoesNotBlockCollection(t *testing.T) {
	rcv := newReceiver(t)
	rcv.refuse.Store(true)
	s := startService(t, rcv.srv.URL, nil)
	step, ids := fanOutRequest("down", 100)
	s.enqueue(t, step)
	s.answerAll(t, ids, "down-CMD")

	// collection is not held up by the failing deliveries
	await(t, 10*time.Second, "the step collected while the receiver refuses", func() bool {
		return testkit.Count(t, s.db.DB, `SELECT COUNT(*) FROM steps`) == 0
	})
	await(t, 10*time.Second, "deliveries tried and refused", func() bool {
		rcv.mu.Lock()
		defer rcv.mu.Unlock()
		return rcv.posts >= len(ids)
	})
	if n := outboxRows(t, s); n != len(ids) {
		t.Fatalf("%d events in the outbox while the receiver refuses, want all %d", n, len(ids))
	}

	rcv.refuse.Store(false)
	await(t, 30*time.Second, "every event delivered after the receiver came back", func() bool {
		return len(rcv.distinct()) == len(ids) && outboxRows(t, s) == 0
	})
}

// Redis dies before the results arrive: delivery does not need it (the
// dispatcher polls the outbox), so every event is delivered while Redis is
// still down; the api keeps the released steps and hands them over once
// Redis is back, and they are collected within seconds.
func TestEventsAreDeliveredWhileRedisIsDownAndStepsCollectedOnceItIsBack(t *testing.T) {
	rcv := newReceiver(t)
	s := startService(t, rcv.srv.URL, func(c *app.WorkerConfig) { c.SweepInterval = 0 })
	step, ids := fanOutRequest("lost", 50)
	s.enqueue(t, step)
	s.redis.Kill()
	s.answerAll(t, ids, "lost-CMD") // 200s: committed, hand-offs fail
	await(t, 15*time.Second, "every event delivered with Redis down", func() bool {
		return len(rcv.distinct()) == len(ids) && outboxRows(t, s) == 0
	})
	steps := func() int {
		var n int
		if err := s.db.QueryRow(`SELECT COUNT(*) FROM steps`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := steps(); n != 1 {
		t.Fatalf("%d steps with Redis down, want the step still there (nothing can collect it)", n)
	}
	s.redis.Restart()
	await(t, 15*time.Second, "the step collected after Redis came back, with the sweeper off", func() bool { return steps() == 0 })
}

// Timeouts and NotUntil reach the workflow engine through the outbox too.
func TestTimeoutsAndDueStepsAreDeliveredAsEvents(t *testing.T) {
	rcv := newReceiver(t)
	s := startService(t, rcv.srv.URL, nil)
	timeout, tids := fanOutRequest("tmo", 3)
	timeout["timeout"] = time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	tStep := s.enqueue(t, timeout)
	due, dids := fanOutRequest("due", 2)
	due["not_until"] = time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	due["commands"] = []map[string]string{{"command_uuid": "due-CMD", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}}
	dStep := s.enqueue(t, due)

	await(t, 15*time.Second, "timed-out and due events delivered", func() bool { return len(rcv.distinct()) == len(tids)+1 })
	got := rcv.distinct()
	for _, id := range tids {
		if ev, ok := got[events.ID(events.StepTimedOut, tStep, id)]; !ok || ev.Type != events.StepTimedOut || ev.Step.Commands[0].Completed {
			t.Errorf("%s: timed-out event %+v", id, ev)
		}
	}
	ev, ok := got[events.ID(events.StepDue, dStep, "")]
	if !ok || len(ev.Step.IDs) != len(dids) || string(ev.Step.Commands[0].Command) != "<plist/>" {
		t.Errorf("due event %+v", ev)
	}
}
