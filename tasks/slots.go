package tasks

import (
	"context"
	"time"

	"github.com/rs/zerolog"
)

// RunSlots calls enqueue once per interval slot until ctx ends. Slots are
// aligned to multiples of interval, so every replica asks for the same
// slot, and a slot-named TaskID lets exactly one of them through (see the
// package doc). A failed enqueue is retried every retryEvery within its
// slot, so the task runs as soon as Redis is back. A slot's failures are
// logged twice at most, at warn: the first, and that the slot went by
// without its task (or, at info, that a retry got it in); the tries
// between are debug lines, so that an outage is not a line a second.
func RunSlots(ctx context.Context, interval, retryEvery time.Duration, logger zerolog.Logger,
	enqueue func(ctx context.Context, slot time.Time, interval time.Duration) error) {
	for {
		slot := time.Now().Truncate(interval)
		for tries := 1; ; tries++ {
			err := enqueue(ctx, slot, interval)
			if err == nil {
				if tries > 1 {
					logger.Info().Time("slot", slot).Int("tries", tries).Msg("enqueued after retrying within the slot")
				}
				break
			}
			next := time.Now().Add(retryEvery)
			last := !next.Before(slot.Add(interval))
			switch {
			case last:
				logger.Warn().Err(err).Time("slot", slot).Int("tries", tries).Msg("enqueueing failed for the whole slot; the next slot tries again")
			case tries == 1:
				logger.Warn().Err(err).Time("slot", slot).Stringer("retry_every", retryEvery).Msg("enqueueing; retrying within the slot")
			default:
				logger.Debug().Err(err).Time("slot", slot).Int("tries", tries).Msg("enqueueing; retrying within the slot")
			}
			if last {
				break // the next slot's task takes over
			}
			if sleepUntil(ctx, next) != nil {
				return
			}
		}
		if sleepUntil(ctx, slot.Add(interval)) != nil {
			return
		}
	}
}

func sleepUntil(ctx context.Context, t time.Time) error {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}
