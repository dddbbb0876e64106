package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// afterRelease runs after a transaction that deleted id_commands rows of
// stepIDs has committed: it asks, without a lock, which of those steps are
// now unreferenced, and collects them inline or hands them to the Collector.
//
// The last enrollment to commit always sees the step unreferenced: every
// other enrollment's deletes committed before its own COMMIT returned, and
// this read runs after that in autocommit, so with a fresh view. Others may
// see it too; the SKIP LOCKED claim lets exactly one of them delete it.
//
// Nothing here is returned to the caller: the result it committed is what
// matters, and a step left behind is inert until a later collection or the
// sweeper takes it.
func (s *Storage) afterRelease(ctx context.Context, stepIDs []int64) {
	if len(stepIDs) == 0 {
		return
	}
	res := storage.CollectResult{}
	var observed []time.Time
	defer func() { s.observer.StepsCollected(res, observed) }()

	now := time.Now()
	var unref []storage.UnreferencedStep
	err := chunks(stepIDs, maxInList, func(batch []int64) error {
		u, err := s.checkSteps(ctx, batch, res)
		for _, id := range u {
			unref = append(unref, storage.UnreferencedStep{ID: id, ObservedAt: now})
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
	if s.collector != nil {
		if err := s.collector.CollectSteps(ctx, unref); err != nil {
			s.logger.Warn().Err(err).Ints64(logkeys.StepIDs, ids(unref)).Msg("handing steps to the collector; the sweeper will find them")
		}
		return
	}
	observed, err = s.claimAndDelete(ctx, unref, res)
	if err != nil {
		s.logger.Warn().Err(err).Ints64(logkeys.StepIDs, ids(unref)).Msg("collecting steps; the sweeper will find them")
	}
}

// Collect deletes those of steps that nothing refers to any more, together
// with their raw commands: a non-locking check, then a SKIP LOCKED claim and
// deletes by key, batched. A step that is still referenced, claimed by
// someone else or already gone is left alone and counted as such; none of
// those is an error. It is what the asynq collector and the sweeper call.
func (s *Storage) Collect(ctx context.Context, steps []storage.UnreferencedStep) (storage.CollectResult, error) {
	res := storage.CollectResult{}
	var observed []time.Time
	defer func() { s.observer.StepsCollected(res, observed) }()

	err := chunks(steps, maxInList, func(batch []storage.UnreferencedStep) error {
		unrefIDs, err := s.checkSteps(ctx, ids(batch), res)
		if err != nil {
			res[storage.CollectError] += len(batch)
			return err
		}
		keep := make(map[int64]bool, len(unrefIDs))
		for _, id := range unrefIDs {
			keep[id] = true
		}
		var unref []storage.UnreferencedStep
		for _, st := range batch {
			if keep[st.ID] {
				unref = append(unref, st)
				delete(keep, st.ID) // a repeated id is collected once
			}
		}
		obs, err := s.claimAndDelete(ctx, unref, res)
		observed = append(observed, obs...)
		return err
	})
	if err != nil {
		return res, fmt.Errorf("collecting %d steps: %w", len(steps), err)
	}
	return res, nil
}

// checkSteps is collection's phase one. It must not run inside a
// transaction: see afterRelease. It counts referenced and gone steps into res
// and returns the unreferenced ones.
func (s *Storage) checkSteps(ctx context.Context, stepIDs []int64, res storage.CollectResult) ([]int64, error) {
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

// claimAndDelete is collection's phase two: one short transaction that
// claims the steps nobody else holds and deletes them, raw commands first.
// It counts the outcomes into res and returns, for each step it deleted,
// when that step was first observed unreferenced.
func (s *Storage) claimAndDelete(ctx context.Context, unref []storage.UnreferencedStep, res storage.CollectResult) ([]time.Time, error) {
	if len(unref) == 0 {
		return nil, nil
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
		return nil, fmt.Errorf("claiming and deleting steps %v: %w", stepIDs, err)
	}
	isClaimed := make(map[int64]bool, len(claimed))
	for _, id := range claimed {
		isClaimed[id] = true
	}
	var observed []time.Time
	for _, st := range unref {
		if isClaimed[st.ID] {
			observed = append(observed, st.ObservedAt)
		}
	}
	res[storage.CollectCollected] += len(claimed)
	res[storage.CollectClaimedElsewhere] += len(unref) - len(claimed)
	return observed, nil
}

func ids(steps []storage.UnreferencedStep) []int64 {
	out := make([]int64, len(steps))
	for i, st := range steps {
		out[i] = st.ID
	}
	return out
}
