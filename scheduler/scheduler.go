// Package scheduler runs what a workflow engine's own worker would run on a
// timer, through the outbox: steps whose timeout passed become
// step.timed_out events, steps whose not_until passed become step.due
// events, each written in the transaction that changes the step.
package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/tasks"
)

// Store is what the scheduler needs of the storage.
type Store interface {
	TimeOutSteps(ctx context.Context, now time.Time) (int, error)
	SendDueSteps(ctx context.Context, now time.Time) (int, error)
}

// Enqueuer puts a slot's schedule task on the queue.
type Enqueuer interface {
	EnqueueSchedule(ctx context.Context, slot time.Time, interval time.Duration) error
}

// Scheduler is the schedule task's handler and its ticker.
type Scheduler struct {
	interval time.Duration
	store    Store
	enq      Enqueuer
	logger   zerolog.Logger

	repush *RePush // nil: no re-push

	ownedOnce sync.Once // says once that cmd/nanocmd owns the schedule
}

// New returns a Scheduler running every interval (0: never).
func New(interval time.Duration, store Store, enq Enqueuer, logger zerolog.Logger, opts ...Option) *Scheduler {
	s := &Scheduler{interval: interval, store: store, enq: enq, logger: logger}
	for _, o := range opts {
		o(s)
	}
	return s
}

// ProcessTask implements asynq.Handler: one run of both, and of the
// re-push when there is one.
func (s *Scheduler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	if _, err := tasks.ParseSlot(t); err != nil {
		s.logger.Error().Err(err).Msg("unreadable schedule task")
		return err
	}
	now := time.Now()
	due, dueErr := s.store.SendDueSteps(ctx, now)
	timedOut, toErr := s.store.TimeOutSteps(ctx, now)
	owned := errors.Is(dueErr, storage.ErrScheduleOwnedByEngine) && errors.Is(toErr, storage.ErrScheduleOwnedByEngine)
	var pushErr error
	if s.repush != nil && !owned {
		if pushErr = s.rePush(ctx, now); errors.Is(pushErr, storage.ErrScheduleOwnedByEngine) {
			pushErr = nil // marked since the claims above: the next run is idle
		}
	}
	if owned {
		// cmd/nanocmd's engine worker acts on them; not a failure to retry
		s.ownedOnce.Do(func() { s.logger.Info().Err(dueErr).Msg("scheduler idle on this database") })
		return nil
	}
	err := errors.Join(dueErr, toErr, pushErr)
	ev := s.logger.Debug()
	if due+timedOut > 0 {
		ev = s.logger.Info()
	}
	if err != nil {
		ev = s.logger.Warn().Err(err)
	}
	ev.Int("due", due).Int("timed_out", timedOut).Msg("schedule")
	return err
}

// Run enqueues one schedule task per interval slot until ctx ends, one per
// slot across replicas (see tasks.RunSlots).
func (s *Scheduler) Run(ctx context.Context) {
	if s.interval <= 0 {
		s.logger.Info().Msg("scheduler disabled (-schedule-interval 0): timeouts, not_until and re-pushes are not acted on")
		<-ctx.Done()
		return
	}
	tasks.RunSlots(ctx, s.interval, time.Second, s.logger, s.enq.EnqueueSchedule)
}
