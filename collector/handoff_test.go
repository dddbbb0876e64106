package collector_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/tasks"
)

// fakeQueue records each enqueue, failing while down.
type fakeQueue struct {
	mu    sync.Mutex
	down  bool
	calls [][]int64
	fails int
}

func (q *fakeQueue) EnqueueCollect(_ context.Context, steps []storage.ReleasedStep) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.down {
		q.fails++
		return errors.New("redis down")
	}
	ids := make([]int64, len(steps))
	for i, st := range steps {
		ids[i] = st.ID
	}
	q.calls = append(q.calls, ids)
	return nil
}

func (q *fakeQueue) snapshot() (calls [][]int64, fails int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return append([][]int64(nil), q.calls...), q.fails
}

func (q *fakeQueue) setDown(down bool) {
	q.mu.Lock()
	q.down = down
	q.mu.Unlock()
}

func enqueued(calls [][]int64) map[int64]int {
	seen := map[int64]int{}
	for _, c := range calls {
		for _, id := range c {
			seen[id]++
		}
	}
	return seen
}

func startHandoff(t *testing.T, cfg collector.HandoffConfig, q *fakeQueue) (*collector.Handoff, context.CancelFunc) {
	h := collector.NewHandoff(cfg, q, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	go h.Run(ctx)
	t.Cleanup(func() { cancel(); <-h.Done() })
	return h, cancel
}

// Releases from many requests inside one window become one task, each step
// once, however often it was released.
func TestHandoffGathersReleasesIntoFewTasks(t *testing.T) {
	t.Parallel()
	q := &fakeQueue{}
	h, _ := startHandoff(t, collector.HandoffConfig{Window: 50 * time.Millisecond}, q)
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// 64 requests, each releasing its own step and the shared one
			h.StepsReleased(context.Background(), []storage.ReleasedStep{{ID: int64(i + 1)}, {ID: 1000}})
		}()
	}
	wg.Wait()
	testkit.WaitUntil(t, 10*time.Second, "all 65 steps enqueued (enqueued so far)", func() (bool, any) {
		c, _ := q.snapshot()
		n := len(enqueued(c))
		return n == 65, n
	})
	calls, _ := q.snapshot()
	if len(calls) > 3 {
		t.Errorf("%d tasks for 64 releases within one window, want a few", len(calls))
	}
	for id, n := range enqueued(calls) {
		if n != 1 {
			t.Errorf("step %d enqueued %d times", id, n)
		}
	}
}

// While the queue is down nothing is lost: the steps are kept and enqueued
// once it is back.
func TestHandoffKeepsStepsWhileTheQueueIsDown(t *testing.T) {
	t.Parallel()
	q := &fakeQueue{down: true}
	h, _ := startHandoff(t, collector.HandoffConfig{Window: time.Millisecond, RetryEvery: 10 * time.Millisecond}, q)
	for i := range 2500 {
		h.StepsReleased(context.Background(), []storage.ReleasedStep{{ID: int64(i + 1)}})
	}
	testkit.WaitUntil(t, 10*time.Second, "a failed enqueue (failures so far)", func() (bool, any) { _, f := q.snapshot(); return f > 0, f })
	// A retry takes them all out while it tries, and puts them back when
	// it fails: read between the queue's refusal and the put-back, none
	// are pending (seen once). Once put back, all of them are.
	testkit.WaitUntil(t, 10*time.Second, "all 2500 pending again after the failed enqueue (pending)", func() (bool, any) {
		n := h.Pending()
		return n == 2500, n
	})
	q.setDown(false)
	testkit.WaitUntil(t, 10*time.Second, "every step enqueued after the queue returned (enqueued so far)", func() (bool, any) {
		c, _ := q.snapshot()
		n := len(enqueued(c))
		return n == 2500, n
	})
	calls, _ := q.snapshot()
	for _, c := range calls {
		if len(c) > 1000 {
			t.Errorf("a task of %d steps, more than MaxPerTask 1000", len(c))
		}
	}
}

// Past MaxPending the oldest are dropped, and counted: the sweeper's.
func TestHandoffDropsTheOldestPastItsBoundAndCountsThem(t *testing.T) {
	t.Parallel()
	q := &fakeQueue{down: true}
	var mu sync.Mutex
	dropped := 0
	h, _ := startHandoff(t, collector.HandoffConfig{MaxPending: 100, RetryEvery: time.Hour,
		OnDrop: func(n int) { mu.Lock(); dropped += n; mu.Unlock() }}, q)
	for i := range 150 {
		h.StepsReleased(context.Background(), []storage.ReleasedStep{{ID: int64(i + 1)}})
	}
	mu.Lock()
	defer mu.Unlock()
	if h.Pending() != 100 || dropped != 50 {
		t.Errorf("pending %d, dropped %d; want 100 and 50", h.Pending(), dropped)
	}
}

// Stopping hands over what is still pending.
func TestHandoffFlushesOnStop(t *testing.T) {
	t.Parallel()
	q := &fakeQueue{}
	h, cancel := startHandoff(t, collector.HandoffConfig{Window: time.Hour}, q)
	h.StepsReleased(context.Background(), []storage.ReleasedStep{{ID: 7}})
	cancel()
	<-h.Done()
	if calls, _ := q.snapshot(); len(enqueued(calls)) != 1 {
		t.Errorf("enqueued %v on stop, want step 7", calls)
	}
}

// stallUntilStop holds the first enqueue until the hand-off is stopped, then
// passes it on with the (now cancelled) context: a stop that lands while a
// flush is under way.
type stallUntilStop struct {
	collector.CollectEnqueuer
	entered chan struct{}
	once    sync.Once
}

func (s *stallUntilStop) EnqueueCollect(ctx context.Context, steps []storage.ReleasedStep) error {
	s.once.Do(func() { close(s.entered); <-ctx.Done() })
	return s.CollectEnqueuer.EnqueueCollect(ctx, steps)
}

// A stop during a flush is not a Redis failure: the steps it carried are
// enqueued by the final flush (no cool-down in the way), and nothing is
// counted in stepcollect_enqueue_failures_total.
func TestHandoffStoppedMidFlushEnqueuesEveryStepAndCountsNoFailure(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, _ := asynq.ParseRedisURI(rs.URL)
	var mu sync.Mutex
	var failures []string
	e := tasks.NewEnqueuer(opt, tasks.OnEnqueueFailure(func(task string) { mu.Lock(); failures = append(failures, task); mu.Unlock() }))
	defer e.Close()
	enq := &stallUntilStop{CollectEnqueuer: e, entered: make(chan struct{})}
	h := collector.NewHandoff(collector.HandoffConfig{}, enq, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	go h.Run(ctx)
	var steps []storage.ReleasedStep
	for i := range 200 {
		steps = append(steps, storage.ReleasedStep{ID: int64(i + 1), ObservedAt: time.Now()})
	}
	h.StepsReleased(context.Background(), steps)
	<-enq.entered
	cancel()
	<-h.Done()

	insp := asynq.NewInspector(opt)
	defer insp.Close()
	pending, err := insp.ListPendingTasks(tasks.QueueCollect)
	if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) { // not found: nothing was enqueued
		t.Fatal(err)
	}
	got := map[int64]bool{}
	for _, info := range pending {
		p, err := tasks.ParseCollect(asynq.NewTask(info.Type, info.Payload))
		if err != nil {
			t.Fatal(err)
		}
		for _, st := range p.Steps {
			got[st.ID] = true
		}
	}
	if len(got) != 200 || h.Pending() != 0 {
		t.Errorf("%d of 200 steps in collect tasks after the stop, %d still pending", len(got), h.Pending())
	}
	mu.Lock()
	defer mu.Unlock()
	if len(failures) != 0 {
		t.Errorf("enqueue failures counted for a stop: %v", failures)
	}
}

// A cancelled caller is not a Redis failure: not counted, and the next
// enqueue goes to Redis at once instead of cooling down.
func TestEnqueuerDoesNotCountACancelledCallerAsARedisFailure(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, _ := asynq.ParseRedisURI(rs.URL)
	var failures []string
	e := tasks.NewEnqueuer(opt, tasks.OnEnqueueFailure(func(task string) { failures = append(failures, task) }), tasks.WithCooldown(time.Hour))
	defer e.Close()
	step := []storage.ReleasedStep{{ID: 1, ObservedAt: time.Now()}}
	gone, cancel := context.WithCancel(t.Context())
	cancel()
	if err := e.EnqueueCollect(gone, step); !errors.Is(err, context.Canceled) {
		t.Errorf("enqueue on a cancelled context: %v, want context.Canceled", err)
	}
	if err := e.EnqueueCollect(t.Context(), step); err != nil {
		t.Errorf("enqueue after a cancelled one: %v, want success (no cool-down)", err)
	}
	if len(failures) != 0 {
		t.Errorf("failures counted: %v", failures)
	}
}

// A queue down for many retries is logged once at warn (then at most every
// 30 s), not once a retry, and its return once at info with the count of
// failed tries.
func TestHandoffLogsAnOutageOnceNotEachRetry(t *testing.T) {
	t.Parallel()
	var buf testkit.LogBuffer
	q := &fakeQueue{down: true}
	h := collector.NewHandoff(collector.HandoffConfig{Window: time.Millisecond, RetryEvery: 5 * time.Millisecond}, q,
		zerolog.New(&buf).Level(zerolog.InfoLevel))
	ctx, cancel := context.WithCancel(context.Background())
	go h.Run(ctx)
	t.Cleanup(func() { cancel(); <-h.Done() })
	h.StepsReleased(context.Background(), []storage.ReleasedStep{{ID: 1}})
	testkit.WaitUntil(t, 10*time.Second, "20 failed hand-offs (so far)", func() (bool, any) { _, f := q.snapshot(); return f >= 20, f })
	q.setDown(false)
	testkit.WaitUntil(t, 10*time.Second, "the step handed over once the queue is back (tasks)", func() (bool, any) {
		c, _ := q.snapshot()
		return len(c) == 1, len(c)
	})
	testkit.WaitUntil(t, 10*time.Second, "the return logged", func() (bool, any) {
		return strings.Contains(buf.String(), "released steps handed to the queue again"), buf.String()
	})
	_, fails := q.snapshot()
	if w := strings.Count(buf.String(), `"level":"warn"`); w != 1 {
		t.Errorf("%d failed hand-offs logged %d warn lines, want 1:\n%s", fails, w, buf.String())
	}
	if !strings.Contains(buf.String(), fmt.Sprintf(`"failed_tries":%d`, fails)) {
		t.Errorf("the return does not count the %d failed tries:\n%s", fails, buf.String())
	}
}
