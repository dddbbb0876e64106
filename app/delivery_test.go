package app_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

var callbackKey = []byte("callback-signing-key")

// service is an API and a worker, in process, on a fresh database and a
// private Redis, delivering to a receiver.
type service struct {
	db     *testkit.DB
	redis  *testkit.Redis
	client *testkit.Client
	worker string // the worker's -metrics-listen address
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
		SweepInterval: time.Second, ScheduleInterval: time.Second, CallbackURL: callbackURL, CallbackHMACKey: string(callbackKey),
		ShutdownTimeout: 2 * time.Second, MySQLPool: stepmysql.Pool{MaxConns: 16},
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
		MaxBodyBytes: 1 << 20, MySQLPool: stepmysql.Pool{MaxConns: 32},
	}, logger)
	if err != nil {
		t.Fatal(err)
	}
	s.client = testkit.NewClient("http://"+a.Addr(), "k")
	s.worker = w.MetricsAddr()
	wg.Add(2)
	go func() { defer wg.Done(); w.Run(ctx) }()
	go func() { defer wg.Done(); a.Run(ctx) }()
	return s
}

// answerAll sends every enrollment's acknowledgement of uuid through
// NanoMDM's webhook sender.
func (s *service) answerAll(t *testing.T, ids []string, uuid string) {
	t.Helper()
	for _, err := range testkit.SendResults(s.client.URL+"/webhook", nil, uuid, ids) {
		t.Error(err)
	}
}

// delivered is how many distinct events rcv has and how many wait in the
// outbox: {n, 0} once all n are delivered and acknowledged.
func (s *service) delivered(t *testing.T, rcv *testkit.Receiver) [2]int {
	return [2]int{rcv.Distinct(), testkit.OutboxRows(t, s.db.DB)}
}

func TestEveryCompletionIsDeliveredSignedAndADedupingReceiverSeesExactlyN(t *testing.T) {
	rcv := testkit.NewReceiver(t, testkit.ReceiverOptions{HMACKey: callbackKey})
	s := startService(t, rcv.URL, nil)
	step, ids := testkit.V1FanOut("deliver", 200)
	stepID := s.client.MustEnqueue(t, step)
	s.answerAll(t, ids, "deliver-CMD")

	testkit.WaitUntil(t, 20*time.Second, "every event delivered and acknowledged: {distinct delivered, outbox rows}", func() (bool, any) {
		d := s.delivered(t, rcv)
		return d == [2]int{len(ids), 0}, d
	})
	got := rcv.Events()
	for _, id := range ids {
		ev, ok := got[testkit.EventID(t, s.db.DB, events.StepCompleted, stepID, id)]
		if !ok || ev.Type != events.StepCompleted || len(ev.Step.IDs) != 1 || ev.Step.IDs[0] != id ||
			!bytes.Contains(ev.Step.Commands[0].Result, []byte(id)) {
			t.Errorf("%s: event %+v", id, ev)
		}
	}
	rcv.Check(t) // every delivery signed, every event well-formed
	t.Logf("%d POSTs for %d events", rcv.Stats().Posts, len(ids))
}

// The receiver answers 503 for a while: nothing is lost, every event
// arrives once it accepts, and collection carries on meanwhile.
func TestReceiverDownForAWhileLosesNothingAndDoesNotBlockCollection(t *testing.T) {
	rcv := testkit.NewReceiver(t, testkit.ReceiverOptions{HMACKey: callbackKey})
	rcv.Refuse(http.StatusServiceUnavailable)
	s := startService(t, rcv.URL, nil)
	step, ids := testkit.V1FanOut("down", 100)
	s.client.MustEnqueue(t, step)
	s.answerAll(t, ids, "down-CMD")

	// collection is not held up by the failing deliveries
	testkit.WaitUntil(t, 10*time.Second, "the step collected while the receiver refuses (steps rows)", func() (bool, any) {
		n := testkit.CountStepRows(t, s.db.DB).Steps
		return n == 0, n
	})
	testkit.WaitUntil(t, 10*time.Second, fmt.Sprintf("%d deliveries tried and refused (refused so far)", len(ids)), func() (bool, any) {
		n := rcv.Stats().Refused
		return n >= len(ids), n
	})
	if n := testkit.OutboxRows(t, s.db.DB); n != len(ids) {
		t.Fatalf("%d events in the outbox while the receiver refuses, want all %d", n, len(ids))
	}

	rcv.Refuse(0)
	testkit.WaitUntil(t, 30*time.Second, "every event delivered after the receiver came back: {distinct delivered, outbox rows}", func() (bool, any) {
		d := s.delivered(t, rcv)
		return d == [2]int{len(ids), 0}, d
	})
	rcv.Check(t)
}

// Redis dies before the results arrive: delivery does not need it (the
// dispatcher polls the outbox), so every event is delivered while Redis is
// still down; the api keeps the released steps and hands them over once
// Redis is back, and they are collected within seconds.
func TestEventsAreDeliveredWhileRedisIsDownAndStepsCollectedOnceItIsBack(t *testing.T) {
	rcv := testkit.NewReceiver(t, testkit.ReceiverOptions{HMACKey: callbackKey})
	s := startService(t, rcv.URL, func(c *app.WorkerConfig) { c.SweepInterval = 0 })
	step, ids := testkit.V1FanOut("lost", 50)
	s.client.MustEnqueue(t, step)
	s.redis.Kill()
	s.answerAll(t, ids, "lost-CMD") // 200s: committed, hand-offs fail
	testkit.WaitUntil(t, 15*time.Second, "every event delivered with Redis down: {distinct delivered, outbox rows}", func() (bool, any) {
		d := s.delivered(t, rcv)
		return d == [2]int{len(ids), 0}, d
	})
	if n := testkit.CountStepRows(t, s.db.DB).Steps; n != 1 {
		t.Fatalf("%d steps with Redis down, want the step still there (nothing can collect it)", n)
	}
	s.redis.Restart()
	testkit.WaitUntil(t, 15*time.Second, "the step collected after Redis came back, with the sweeper off (steps rows)", func() (bool, any) {
		n := testkit.CountStepRows(t, s.db.DB).Steps
		return n == 0, n
	})
	rcv.Check(t)
}

// Timeouts and NotUntil reach the workflow engine through the outbox too.
func TestTimeoutsAndDueStepsAreDeliveredAsEvents(t *testing.T) {
	rcv := testkit.NewReceiver(t, testkit.ReceiverOptions{HMACKey: callbackKey})
	s := startService(t, rcv.URL, nil)
	timeout, tids := testkit.V1FanOut("tmo", 3)
	timeout["timeout"] = time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	tStep := s.client.MustEnqueue(t, timeout)
	due, dids := testkit.V1FanOut("due", 2)
	due["not_until"] = time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	due["commands"] = []map[string]string{{"command_uuid": "due-CMD", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}}
	dStep := s.client.MustEnqueue(t, due)

	testkit.WaitUntil(t, 15*time.Second, "timed-out and due events delivered (distinct delivered)", func() (bool, any) {
		n := rcv.Distinct()
		return n == len(tids)+1, n
	})
	rcv.Check(t)
	got := rcv.Events()
	for _, id := range tids {
		if ev, ok := got[testkit.EventID(t, s.db.DB, events.StepTimedOut, tStep, id)]; !ok || ev.Type != events.StepTimedOut || ev.Step.Commands[0].Completed {
			t.Errorf("%s: timed-out event %+v", id, ev)
		}
	}
	ev, ok := got[testkit.EventID(t, s.db.DB, events.StepDue, dStep, "")]
	if !ok || len(ev.Step.IDs) != len(dids) || string(ev.Step.Commands[0].Command) != "<plist/>" {
		t.Errorf("due event %+v", ev)
	}
}
