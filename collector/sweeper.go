package collector

import (
	"context"
	"errors"
	"time"

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/tasks"
)

// SweepStore is what the sweeper needs of the storage.
type SweepStore interface {
	Store
	ScanUnreferencedSteps(ctx context.Context, after int64, limit int) (storage.ScanPage, error)
	ScanOrphanedStepCommands(ctx context.Context, after int64, limit int) (storage.ScanPage, error)
	DeleteOrphanedStepCommands(ctx context.Context, stepIDs []int64) (int64, error)
	// RecordSweep stores what the sweep found, for every replica's
	// stepcollect_uncollected_steps.
	RecordSweep(ctx context.Context, uncollected int) error
}

// SweepEnqueuer puts a slot's sweep task on the queue.
type SweepEnqueuer interface {
	EnqueueSweep(ctx context.Context, slot time.Time, interval time.Duration) error
}

// SweeperConfig configures a Sweeper.
type SweeperConfig struct {
	// Interval between sweeps, across all replicas. Zero disables the
	// ticker (a sweep task that arrives is still processed).
	Interval time.Duration
	// BatchSize is the rows examined by one statement. Default 1000.
	BatchSize int
	// RetryEvery is how often a replica retries a slot's enqueue that
	// failed (Redis down). Default 1s.
	RetryEvery time.Duration
}

// Sweeper finds and collects what a lost enqueue left: unreferenced steps,
// and raw commands whose step is gone. It pages through the tables by key
// in bounded batches, so no statement scans a table, and it is safe with
// any number of replicas: see the tasks package for why exactly one sweep
// runs per interval.
type Sweeper struct {
	cfg     SweeperConfig
	store   SweepStore
	enq     SweepEnqueuer
	metrics *metrics.Sweeper
	logger  zerolog.Logger
}

// NewSweeper returns a Sweeper.
func NewSweeper(cfg SweeperConfig, store SweepStore, enq SweepEnqueuer, m *metrics.Sweeper, logger zerolog.Logger) *Sweeper {
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 1000
	}
	if cfg.RetryEvery <= 0 {
		cfg.RetryEvery = time.Second
	}
	return &Sweeper{cfg: cfg, store: store, enq: enq, metrics: m, logger: logger}
}

// SweepResult is what one sweep found and did.
type SweepResult struct {
	Examined             int // steps looked at
	Unreferenced         int // of those, nothing referred to
	Collected            int // of those, deleted by this sweep
	OrphanedStepCommands int64
}

// ProcessTask implements asynq.Handler for sweep tasks.
func (s *Sweeper) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := tasks.ParseSlot(t)
	if err != nil {
		s.logger.Error().Err(err).Msg("unreadable sweep task")
		return err
	}
	start := time.Now()
	res, err := s.SweepCounted(ctx, metrics.SweepPeriodic)
	ev := s.logger.Info()
	if err != nil {
		ev = s.logger.Warn().Err(err)
	}
	ev.Time("slot", p.Slot).Int("examined", res.Examined).Int("unreferenced", res.Unreferenced).
		Int("collected", res.Collected).Int64("orphaned_step_commands", res.OrphanedStepCommands).
		Dur("took_ms", time.Since(start)).Msg("sweep")
	return err
}

// SweepCounted is Sweep, counted in stepcollect_sweeps_total under
// trigger (metrics.SweepPeriodic, SweepStart, …) and timed in
// stepcollect_sweep_duration_seconds, so that every sweep a replica runs
// shows, not only its slots'. A sweep cut short by ctx (shutdown) is not
// counted.
func (s *Sweeper) SweepCounted(ctx context.Context, trigger string) (SweepResult, error) {
	start := time.Now()
	res, err := s.Sweep(ctx)
	if ctx.Err() != nil {
		return res, err
	}
	s.metrics.SweepDurationSeconds.Observe(time.Since(start).Seconds())
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	s.metrics.Sweeps.WithLabelValues(outcome, trigger).Inc()
	return res, err
}

// Sweep pages through the steps table once, collecting every unreferenced
// step it finds, then through the raw commands for orphans. It records what
// it found unreferenced in MySQL, where every replica's
// stepcollect_uncollected_steps reads it. Outbox events are not its
// business: the delivery dispatcher polls the outbox.
func (s *Sweeper) Sweep(ctx context.Context) (SweepResult, error) {
	var res SweepResult
	for page, cursor := (storage.ScanPage{More: true}), int64(0); page.More; cursor = page.Next {
		var err error
		page, err = s.store.ScanUnreferencedSteps(ctx, cursor, s.cfg.BatchSize)
		if err != nil {
			return res, err
		}
		res.Examined += page.Rows
		if len(page.Found) == 0 {
			continue
		}
		res.Unreferenced += len(page.Found)
		steps := make([]storage.ReleasedStep, len(page.Found))
		for i, id := range page.Found {
			// when it became unreferenced is not known here; the lag
			// histogram only counts steps whose hand-off carried it
			steps[i] = storage.ReleasedStep{ID: id}
		}
		cr, err := s.store.Collect(ctx, steps)
		res.Collected += cr[storage.CollectCollected]
		if errors.Is(err, storage.ErrClaimSkipped) {
			// held by someone right now: the next sweep looks again
			s.logger.Info().Err(err).Msg("sweep: steps locked elsewhere are left for the next sweep")
		} else if err != nil {
			return res, err
		}
	}
	if err := s.store.RecordSweep(ctx, res.Unreferenced); err != nil {
		return res, err
	}

	for page, cursor := (storage.ScanPage{More: true}), int64(0); page.More; cursor = page.Next {
		var err error
		page, err = s.store.ScanOrphanedStepCommands(ctx, cursor, s.cfg.BatchSize)
		if err != nil {
			return res, err
		}
		if len(page.Found) > 0 {
			n, err := s.store.DeleteOrphanedStepCommands(ctx, page.Found)
			res.OrphanedStepCommands += n
			s.metrics.OrphanedStepCommands.Add(float64(n))
			if err != nil {
				return res, err
			}
		}
	}

	return res, nil
}

// Run enqueues one sweep per interval slot until ctx ends (see
// tasks.RunSlots for why that is one sweep per interval across replicas).
func (s *Sweeper) Run(ctx context.Context) error {
	if s.cfg.Interval <= 0 {
		s.logger.Info().Msg("sweeper disabled (-sweep-interval 0)")
		<-ctx.Done()
		return nil
	}
	tasks.RunSlots(ctx, s.cfg.Interval, s.cfg.RetryEvery, s.logger, s.enq.EnqueueSweep)
	return nil
}

// SweepAtStart sweeps once, in process, when a worker starts. A worker
// that was killed left its collect tasks active in Redis until asynq's
// lease (30 s) and recoverer (every minute) hand them back; its restart
// should not wait for that. Any number of replicas starting together is
// harmless: collection is idempotent. Nothing when sweeps are off.
func (s *Sweeper) SweepAtStart(ctx context.Context) {
	if s.cfg.Interval <= 0 {
		return
	}
	res, err := s.SweepCounted(ctx, metrics.SweepStart)
	if err != nil && ctx.Err() == nil {
		s.logger.Warn().Err(err).Msg("sweep at start failed; the next sweep slot tries again")
		return
	}
	s.logger.Info().Int("examined", res.Examined).Int("collected", res.Collected).Msg("swept at start")
}

// SweepOnQueueLoss sweeps once, in process, whenever the queue's Redis r
// comes back after failing, or comes back empty (WatchQueueLoss), until
// ctx ends: the collect tasks it held (handed over by the api, not yet
// taken by a worker) may be gone with it, and waiting for the next sweep
// slot would cost up to an interval. Every replica does it; collection is
// idempotent. marker is the deployment's (tasks.QueueNames.Marker). Nothing
// when sweeps are off.
func (s *Sweeper) SweepOnQueueLoss(ctx context.Context, r asynq.RedisConnOpt, marker string) {
	if s.cfg.Interval <= 0 {
		return
	}
	sweep := func(reason string) {
		res, err := s.SweepCounted(ctx, metrics.SweepQueueLoss)
		if err != nil && ctx.Err() == nil {
			s.logger.Warn().Err(err).Str(logkeys.Reason, reason).Msg("sweep after a possible queue loss failed; the next sweep slot tries again")
			return
		}
		s.logger.Info().Str(logkeys.Reason, reason).Int("examined", res.Examined).Int("collected", res.Collected).Msg("swept after a possible queue loss")
	}
	WatchQueueLoss(ctx, r, marker, time.Second, s.logger, func(reason string) {
		sweep(reason)
		// once more a little later: after a failover, an api that heard of
		// the new primary after this worker may still have handed steps to
		// the old one, which discards them when it rejoins as a replica
		select {
		case <-ctx.Done():
		case <-time.After(3 * time.Second):
			sweep(reason + " (again)")
		}
	})
}

// SweepOnServerChange sweeps once, in process, whenever a database server
// not seen before starts answering (WatchServer), until ctx ends: after a
// failover to an asynchronous replica the steps whose collection the old
// primary committed last are back, unreferenced, and would otherwise wait
// for the next sweep slot. Every replica does it; collection is
// idempotent. Nothing when sweeps are off.
func (s *Sweeper) SweepOnServerChange(ctx context.Context, db ServerIdentifier) {
	if s.cfg.Interval <= 0 {
		return
	}
	WatchServer(ctx, db, time.Second, s.logger, func(from, to string) {
		res, err := s.SweepCounted(ctx, metrics.SweepServerChange)
		l := s.logger.With().Str("from", from).Str("to", to).Logger()
		if err != nil && ctx.Err() == nil {
			l.Warn().Err(err).Msg("sweep after the database server changed failed; the next sweep slot tries again")
			return
		}
		l.Info().Int("examined", res.Examined).Int("collected", res.Collected).Msg("swept after the database server changed")
	})
}
