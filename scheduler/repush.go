package scheduler

import (
	"context"
	"errors"
	"time"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// RePushStore is what re-pushing needs of the storage.
type RePushStore interface {
	// ClaimRePushes returns the enrollments with a command last pushed
	// before ifBefore and marks those commands pushed at pushTime.
	ClaimRePushes(ctx context.Context, ifBefore, pushTime time.Time) ([]string, error)
}

// PushSender pushes enrollments and says how many were acknowledged.
type PushSender interface {
	Push(ctx context.Context, ids []string) (ok int)
}

// RePush is the scheduler's re-push: in each run, enrollments with a
// command unanswered for Interval are pushed again, as NanoCMD's engine
// worker does with its -repush-interval.
type RePush struct {
	Interval time.Duration
	Store    RePushStore
	Pusher   PushSender
}

// Option configures a Scheduler.
type Option func(*Scheduler)

// WithRePush adds the re-push to every run (an Interval of 0: none).
func WithRePush(r RePush) Option {
	return func(s *Scheduler) {
		if r.Interval > 0 {
			s.repush = &r
		}
	}
}

// rePush runs one re-push. The rows are marked before the push, as
// NanoCMD's engine does: an enrollment whose push fails is pushed again
// one interval later, not at every run.
func (s *Scheduler) rePush(ctx context.Context, now time.Time) error {
	start := time.Now()
	ids, err := s.repush.Store.ClaimRePushes(ctx, now.Add(-s.repush.Interval), now)
	if errors.Is(err, storage.ErrScheduleOwnedByEngine) {
		return err
	}
	ok := 0
	if len(ids) > 0 {
		ok = s.repush.Pusher.Push(ctx, ids) // marked, so pushed even after a later batch failed
	}
	ev := s.logger.Debug()
	switch {
	case err != nil:
		ev = s.logger.Warn().Err(err)
	case len(ids) > 0:
		ev = s.logger.Info()
	}
	ev.Int(logkeys.Count, len(ids)).Int("acknowledged", ok).Int64("duration_ms", time.Since(start).Milliseconds()).
		Str("repush_interval", s.repush.Interval.String()).Msg("re-push")
	return err
}
