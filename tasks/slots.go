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
// slot, so the task runs as soon as Redis is back.
func RunSlots(ctx context.Context, interval, retryEvery time.Duration, logger zerolog.Logger,
	enqueue func(ctx context.Context, slot time.Time, interval time.Duration) error) {
	for {
		slot := time.Now().Truncate(interval)
		for {
			err := enqueue(ctx, slot, interval)
			if err == nil {
				break
			}
			logger.Warn().Err(err).Time("slot", slot).Msg("enqueueing; retrying within the slot")
			next := time.Now().Add(retryEvery)
			if !next.Before(slot.Add(interval)) {
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
