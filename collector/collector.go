// Package collector gets released steps collected, off the MDM-facing
// path: the api's hand-off that batches them onto the queue, the asynq
// handler of collect tasks, and the sweeper that finds what a lost
// hand-off left behind, on its interval, when a worker starts and when the
// queue may have lost tasks. All are thin over the storage, which does the
// non-locking check, the SKIP LOCKED claim and the point deletes; the
// queue's wire formats and its enqueuer are the tasks package's.
package collector

import (
	"context"
	"fmt"

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/tasks"
)

// Store is what collection needs of the storage.
type Store interface {
	// Collect deletes those of steps nothing refers to; a step referenced,
	// claimed elsewhere or gone is not an error.
	Collect(ctx context.Context, steps []storage.ReleasedStep) (storage.CollectResult, error)
}

// Handler processes collect tasks. The storage's observer records
// stepcollect_collect_runs_total, _steps_collected_total and
// _collection_lag_seconds (from each step's ObservedAt, carried in the
// payload).
type Handler struct {
	store  Store
	logger zerolog.Logger
}

// NewHandler returns a collect task handler on store.
func NewHandler(store Store, logger zerolog.Logger) *Handler {
	return &Handler{store: store, logger: logger}
}

// ProcessTask implements asynq.Handler. An error makes asynq retry the task
// with backoff; a payload it cannot read is not retried.
func (h *Handler) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := tasks.ParseCollect(t)
	if err != nil {
		h.logger.Error().Err(err).Msg("unreadable collect task")
		return err
	}
	ids := make([]int64, len(p.Steps))
	for i, st := range p.Steps {
		ids[i] = st.ID
	}
	res, err := h.store.Collect(ctx, p.ReleasedSteps())
	if err != nil {
		h.logger.Warn().Err(err).Ints64(logkeys.StepIDs, ids).Msg("collecting steps; asynq will retry")
		return fmt.Errorf("collect task: %w", err)
	}
	h.logger.Debug().Ints64(logkeys.StepIDs, ids).
		Int("collected", res[storage.CollectCollected]).
		Int("claimed_elsewhere", res[storage.CollectClaimedElsewhere]).
		Int("gone", res[storage.CollectGone]).
		Int("referenced", res[storage.CollectReferenced]).
		Msg("collect task done")
	return nil
}
