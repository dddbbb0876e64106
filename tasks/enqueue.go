package tasks

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/storage"
)

// Enqueuer puts stepcollect's tasks on the queue: the collect tasks the
// api's hand-off (collector.Handoff) batches, and the sweep and schedule
// tasks of each interval slot.
//
// It never lets Redis hold up its caller for long: each enqueue has a short
// deadline, and after a failure further enqueues fail at once for a moment
// (the sweeper finds whatever they would have carried), so a Redis outage
// costs the MDM-facing path almost nothing.
type Enqueuer struct {
	client   *asynq.Client
	ns       *Namespace
	onFail   func(task string)
	timeout  time.Duration
	cooldown time.Duration

	mu        sync.Mutex
	downUntil time.Time
}

// ErrRedisCoolingDown is returned while the enqueuer is not trying Redis
// after a recent failure.
var ErrRedisCoolingDown = errors.New("redis unavailable a moment ago; not retrying yet (the sweeper will find the work)")

var _ storage.ReleaseSink = (*Enqueuer)(nil)

// EnqueuerOption configures an Enqueuer.
type EnqueuerOption func(*Enqueuer)

// OnEnqueueFailure is called with the task type each time an enqueue
// fails (stepcollect_enqueue_failures_total{task}).
func OnEnqueueFailure(f func(task string)) EnqueuerOption {
	return func(e *Enqueuer) { e.onFail = f }
}

// WithCooldown is how long enqueues fail fast after a failure. Default 1s.
func WithCooldown(d time.Duration) EnqueuerOption { return func(e *Enqueuer) { e.cooldown = d } }

// WithNamespace puts the tasks on the queues ns names (the binaries':
// their deployment's). Without it they go on NamesFor("").
func WithNamespace(ns *Namespace) EnqueuerOption { return func(e *Enqueuer) { e.ns = ns } }

// ErrNoNamespace is returned while the queues' names are not known: the
// deployment's database has not been migrated yet.
var ErrNoNamespace = errors.New("the queues' names are not known yet: the database is not migrated (the sweeper will find the work)")

// NewEnqueuer returns an Enqueuer on Redis r.
func NewEnqueuer(r asynq.RedisConnOpt, opts ...EnqueuerOption) *Enqueuer {
	e := &Enqueuer{
		client:   asynq.NewClient(WithFastFailure(r)),
		ns:       NewNamespace(NamesFor("")),
		onFail:   func(string) {},
		timeout:  time.Second,
		cooldown: time.Second,
	}
	for _, o := range opts {
		o(e)
	}
	return e
}

// Close closes the Redis client.
func (e *Enqueuer) Close() error { return e.client.Close() }

// Ping checks Redis.
func (e *Enqueuer) Ping() error { return e.client.Ping() }

// EnqueueCollect enqueues one collect task for steps. Collect tasks carry
// no TaskID: see the package doc.
func (e *Enqueuer) EnqueueCollect(ctx context.Context, steps []storage.ReleasedStep) error {
	if len(steps) == 0 {
		return nil
	}
	t, opts, err := NewCollectTask(e.ns.Names().Collect, steps)
	if err != nil {
		return err
	}
	return e.enqueue(ctx, t, opts)
}

// StepsReleased implements storage.ReleaseSink with one collect task per
// commit, enqueued on the committing goroutine: for a storage that should
// hand its releases straight to the queue, unbatched (tests, a library
// user). The api batches them through collector.Handoff instead.
func (e *Enqueuer) StepsReleased(ctx context.Context, steps []storage.ReleasedStep) error {
	return e.EnqueueCollect(ctx, steps)
}

// EnqueueSchedule enqueues the schedule task of the slot starting at slot.
func (e *Enqueuer) EnqueueSchedule(ctx context.Context, slot time.Time, interval time.Duration) error {
	t, opts, err := NewScheduleTask(e.ns.Names().Sweep, slot, interval)
	if err != nil {
		return err
	}
	return e.enqueue(ctx, t, opts)
}

// EnqueueSweep enqueues the sweep of the slot starting at slot. Another
// replica having done so already is success.
func (e *Enqueuer) EnqueueSweep(ctx context.Context, slot time.Time, interval time.Duration) error {
	t, opts, err := NewSweepTask(e.ns.Names().Sweep, slot, interval)
	if err != nil {
		return err
	}
	return e.enqueue(ctx, t, opts)
}

type noCooldownKey struct{}

// WithoutCooldown marks ctx as a last attempt (a stop's final flush): it
// tries Redis even during the cool-down, since there is no later attempt.
func WithoutCooldown(ctx context.Context) context.Context {
	return context.WithValue(ctx, noCooldownKey{}, true)
}

func (e *Enqueuer) enqueue(ctx context.Context, t *asynq.Task, opts []asynq.Option) error {
	if err := ctx.Err(); err != nil {
		// the caller gave up: says nothing about Redis
		return fmt.Errorf("enqueue %s: %w", t.Type(), err)
	}
	if !e.ns.Names().Known() {
		e.onFail(t.Type())
		return fmt.Errorf("enqueue %s: %w", t.Type(), ErrNoNamespace)
	}
	e.mu.Lock()
	cooling := time.Now().Before(e.downUntil)
	e.mu.Unlock()
	if cooling && ctx.Value(noCooldownKey{}) == nil {
		e.onFail(t.Type())
		return fmt.Errorf("enqueue %s: %w", t.Type(), ErrRedisCoolingDown)
	}
	tctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	_, err := e.client.EnqueueContext(tctx, t, opts...)
	if err == nil || errors.Is(err, asynq.ErrTaskIDConflict) || errors.Is(err, asynq.ErrDuplicateTask) {
		return nil
	}
	if ctx.Err() != nil {
		// cancelled (or out of time) by the caller, not a Redis failure:
		// no count, no cool-down
		return fmt.Errorf("enqueue %s: %w", t.Type(), ctx.Err())
	}
	e.onFail(t.Type())
	e.mu.Lock()
	e.downUntil = time.Now().Add(e.cooldown)
	e.mu.Unlock()
	return fmt.Errorf("enqueue %s: %w", t.Type(), err)
}

// WithFastFailure shortens a Redis connection's timeouts where they were
// left at go-redis's defaults (5 s dial, 3 s read and write), which would
// otherwise hold a webhook request for seconds when Redis is down. For
// Sentinel the same bounds are what following a failover needs: every new
// connection asks a Sentinel for the primary, and a command to a hung
// primary ends at the read timeout or at +switch-master. go-redis's retries
// and pool wait stay, bounded by the Enqueuer's 1 s context. What a
// failover costs (e2e/failover): docs/operations.md, "Redis".
func WithFastFailure(r asynq.RedisConnOpt) asynq.RedisConnOpt {
	switch o := r.(type) {
	case asynq.RedisClientOpt:
		o.DialTimeout = orDefault(o.DialTimeout, 500*time.Millisecond)
		o.ReadTimeout = orDefault(o.ReadTimeout, time.Second)
		o.WriteTimeout = orDefault(o.WriteTimeout, time.Second)
		return o
	case asynq.RedisFailoverClientOpt:
		// the same values, for the reasons above
		o.DialTimeout = orDefault(o.DialTimeout, 500*time.Millisecond)
		o.ReadTimeout = orDefault(o.ReadTimeout, time.Second)
		o.WriteTimeout = orDefault(o.WriteTimeout, time.Second)
		return o
	}
	return r
}

func orDefault(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}
