package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// afterRelease runs after a transaction that deleted id_commands rows of
// stepIDs has committed: with a ReleaseSink it hands them over unchecked;
// without one it checks them without a lock and collects the unreferenced
// ones inline, grouped with concurrent callers' (releaseGroups). The last
// enrollment to commit always sees its step unreferenced, as its group's
// check starts after its COMMIT with a fresh view; the SKIP LOCKED claim
// lets one of many who see it delete it. Nothing is returned: the result
// committed is what matters, and a step left behind waits for a later
// collection or the sweeper.
func (s *Storage) afterRelease(ctx context.Context, stepIDs []int64) {
	if len(stepIDs) == 0 {
		return
	}
	if s.sink != nil {
		now := time.Now()
		released := make([]storage.ReleasedStep, len(stepIDs))
		for i, id := range stepIDs {
			released[i] = storage.ReleasedStep{ID: id, ObservedAt: now}
		}
		if err := s.sink.StepsReleased(ctx, released); err != nil {
			s.logger.Warn().Err(err).Ints64(logkeys.StepIDs, stepIDs).Msg("handing steps to the collector; the sweeper will find them")
		}
		return
	}
	s.inline.collect(ctx, stepIDs)
}

// collectInline is the inline collection of stepIDs: a check without a
// lock, then a claim and deletes of the unreferenced ones.
func (s *Storage) collectInline(ctx context.Context, stepIDs []int64) {
	res := storage.CollectResult{}
	var observed []time.Time
	defer func() { s.observer.StepsCollected(res, observed) }()

	now := time.Now()
	var unref []storage.ReleasedStep
	err := chunks(stepIDs, maxInList, func(batch []int64) error {
		u, err := s.checkSteps(ctx, batch, res)
		for _, id := range u {
			unref = append(unref, storage.ReleasedStep{ID: id, ObservedAt: now})
		}
		return err
	})
	if err != nil {
		res[storage.CollectError] += len(stepIDs)
		s.logger.Warn().Err(err).Ints64(logkeys.StepIDs, stepIDs).Msg("checking steps for collection; the sweeper will find them")
		return
	}
	if len(unref) == 0 {
		return
	}
	observed, err = s.claimUntilGone(ctx, unref, res)
	if err != nil {
		s.logger.Warn().Err(err).Ints64(logkeys.StepIDs, ids(unref)).Msg("collecting steps; the sweeper will find them")
	}
}

// Collect deletes those of steps that nothing refers to any more, together
// with their raw commands: a non-locking check, then a SKIP LOCKED claim and
// deletes by key, batched. A step that is still referenced or already gone
// is left alone and counted as such. A step the claim skipped is held by
// someone, who may or may not delete it: it is checked and claimed again
// until a read shows it gone, and if it is still held after that, Collect
// returns an error wrapping storage.ErrClaimSkipped naming it, so that the
// caller tries again later. It is what the asynq collector and the sweeper
// call.
func (s *Storage) Collect(ctx context.Context, steps []storage.ReleasedStep) (storage.CollectResult, error) {
	res := storage.CollectResult{}
	var observed []time.Time
	defer func() { s.observer.StepsCollected(res, observed) }()

	var skipped []error // the other batches still get their turn
	err := chunks(steps, maxInList, func(batch []storage.ReleasedStep) error {
		unrefIDs, err := s.checkSteps(ctx, ids(batch), res)
		if err != nil {
			res[storage.CollectError] += len(batch)
			return err
		}
		keep := make(map[int64]bool, len(unrefIDs))
		for _, id := range unrefIDs {
			keep[id] = true
		}
		var unref []storage.ReleasedStep
		for _, st := range batch {
			if keep[st.ID] {
				unref = append(unref, st)
				delete(keep, st.ID) // a repeated id is collected once
			}
		}
		obs, err := s.claimUntilGone(ctx, unref, res)
		observed = append(observed, obs...)
		if errors.Is(err, storage.ErrClaimSkipped) {
			skipped = append(skipped, err)
			return nil
		}
		return err
	})
	if err = errors.Join(append(skipped, err)...); err != nil {
		return res, fmt.Errorf("collecting %d steps: %w", len(steps), err)
	}
	return res, nil
}

// checkSteps is collection's phase one. It must not run inside a
// transaction: see afterRelease. It counts referenced and gone steps into res
// and returns the unreferenced ones.
func (s *Storage) checkSteps(ctx context.Context, stepIDs []int64, res storage.CollectResult) ([]int64, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	rs, err := s.db.QueryContext(ctx, expand(qCheckSteps, len(stepIDs)), args(stepIDs)...)
	if err != nil {
		return nil, fmt.Errorf("checking references: %w", err)
	}
	defer rs.Close()
	present := make(map[int64]bool, len(stepIDs))
	var unref []int64
	for rs.Next() {
		var id int64
		var referenced bool
		if err := rs.Scan(&id, &referenced); err != nil {
			return nil, fmt.Errorf("checking references: %w", err)
		}
		present[id] = true
		if referenced {
			res[storage.CollectReferenced]++
		} else {
			unref = append(unref, id)
		}
	}
	if err := rs.Err(); err != nil {
		return nil, fmt.Errorf("checking references: %w", err)
	}
	seen := make(map[int64]bool, len(stepIDs))
	for _, id := range stepIDs {
		if !present[id] && !seen[id] {
			res[storage.CollectGone]++
		}
		seen[id] = true
	}
	return unref, nil
}

// How often, and how patiently, a claim that SKIP LOCKED passed over is
// tried again before the step is handed back to the caller: the locks that
// get in the way (another collector's claim, the scheduler's claims, a
// foreign-key check) last milliseconds.
const (
	claimRetries     = 6
	claimRetryBase   = 10 * time.Millisecond
	claimRetryFactor = 2
)

// claimUntilGone claims and deletes unref. A step the claim skipped is
// read again (without a lock) after a short pause: gone means whoever held
// it collected it; still there means the claim is tried again. What is
// still held after claimRetries is counted claimed_elsewhere and returned
// as an error wrapping storage.ErrClaimSkipped: it is not collected, and
// nobody may assume it will be.
func (s *Storage) claimUntilGone(ctx context.Context, unref []storage.ReleasedStep, res storage.CollectResult) ([]time.Time, error) {
	var observed []time.Time
	pause := claimRetryBase
	for try := 0; ; try++ {
		obs, skipped, err := s.claimAndDelete(ctx, unref, res)
		observed = append(observed, obs...)
		if err != nil || len(skipped) == 0 {
			return observed, err
		}
		if try == claimRetries {
			res[storage.CollectClaimedElsewhere] += len(skipped)
			return observed, fmt.Errorf("steps %v: %w", ids(skipped), storage.ErrClaimSkipped)
		}
		if err := sleepCtx(ctx, pause/2+rand.N(pause)); err != nil {
			res[storage.CollectError] += len(skipped)
			return observed, err
		}
		pause *= claimRetryFactor
		// A read that shows a step gone settles it; one that shows it
		// still there (unreferenced: that is terminal) sends it back to
		// the claim.
		still, err := s.checkSteps(ctx, ids(skipped), res)
		if err != nil {
			res[storage.CollectError] += len(skipped)
			return observed, err
		}
		keep := make(map[int64]bool, len(still))
		for _, id := range still {
			keep[id] = true
		}
		unref = unref[:0:0]
		for _, st := range skipped {
			if keep[st.ID] {
				unref = append(unref, st)
			}
		}
		if len(unref) == 0 {
			return observed, nil
		}
	}
}

// claimAndDelete is collection's phase two: one short transaction that
// claims the steps nobody else holds and deletes them, raw commands first.
// It counts the collected ones into res and returns, for each step it
// deleted, when that step was first observed unreferenced, and the steps
// the claim skipped.
func (s *Storage) claimAndDelete(ctx context.Context, unref []storage.ReleasedStep, res storage.CollectResult) ([]time.Time, []storage.ReleasedStep, error) {
	if len(unref) == 0 {
		return nil, nil, nil
	}
	stepIDs := ids(unref)
	var claimed []int64
	err := s.inTx(ctx, storage.OpCollectSteps, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
		var err error
		claimed, err = queryInt64s(ctx, tx, expand(qClaimSteps, len(stepIDs)), args(stepIDs)...)
		if err != nil || len(claimed) == 0 {
			return err
		}
		if _, err := tx.ExecContext(ctx, expand(qDeleteStepCommands, len(claimed)), args(claimed)...); err != nil {
			return fmt.Errorf("deleting raw commands: %w", err)
		}
		if _, err := tx.ExecContext(ctx, expand(qDeleteSteps, len(claimed)), args(claimed)...); err != nil {
			return fmt.Errorf("deleting steps: %w", err)
		}
		return nil
	})
	if err != nil {
		res[storage.CollectError] += len(unref)
		return nil, nil, fmt.Errorf("claiming and deleting steps %v: %w", stepIDs, err)
	}
	isClaimed := make(map[int64]bool, len(claimed))
	for _, id := range claimed {
		isClaimed[id] = true
	}
	var observed []time.Time
	var skipped []storage.ReleasedStep
	for _, st := range unref {
		if isClaimed[st.ID] {
			observed = append(observed, st.ObservedAt)
		} else {
			skipped = append(skipped, st)
		}
	}
	res[storage.CollectCollected] += len(claimed)
	return observed, skipped, nil
}

func ids(steps []storage.ReleasedStep) []int64 {
	out := make([]int64, len(steps))
	for i, st := range steps {
		out[i] = st.ID
	}
	return out
}
