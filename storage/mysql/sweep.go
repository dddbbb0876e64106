package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/stepcollect/stepcollect/storage"
)

// ScanUnreferencedSteps returns, among the next limit steps with an id
// above after, those nothing refers to. Outside any transaction, for the
// same reason as collection's check. It is what the sweeper pages through
// to find steps whose collection was lost (Redis down at commit time, a
// process killed between commit and hand-off).
func (s *Storage) ScanUnreferencedSteps(ctx context.Context, after int64, limit int) (storage.ScanPage, error) {
	p, err := s.scan(ctx, qScanSteps, after, limit)
	if err != nil {
		return p, fmt.Errorf("scanning steps after %d: %w", after, err)
	}
	return p, nil
}

// ScanOrphanedStepCommands returns, among the next limit step ids above
// after that hold raw commands, those whose step no longer exists.
func (s *Storage) ScanOrphanedStepCommands(ctx context.Context, after int64, limit int) (storage.ScanPage, error) {
	p, err := s.scan(ctx, qScanStepCommandOwners, after, limit)
	if err != nil {
		return p, fmt.Errorf("scanning raw commands after step %d: %w", after, err)
	}
	return p, nil
}

// scan pages through (id, has) rows, keeping the ids that lack what the
// query asks about: references for a step, a step for raw commands.
func (s *Storage) scan(ctx context.Context, query string, after int64, limit int) (storage.ScanPage, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	p := storage.ScanPage{Next: after}
	n := 0
	_, err := queryList(ctx, s.db, query, []any{after, limit}, func(rs *sql.Rows) (struct{}, error) {
		var id int64
		var has bool
		if err := rs.Scan(&id, &has); err != nil {
			return struct{}{}, err
		}
		n++
		p.Next = id
		if !has {
			p.Found = append(p.Found, id)
		}
		return struct{}{}, nil
	})
	p.Rows = n
	p.More = err == nil && n == limit
	return p, err
}

// DeleteOrphanedStepCommands deletes the raw commands of steps that no
// longer exist. Step ids are never reused, so nothing live can be hit.
func (s *Storage) DeleteOrphanedStepCommands(ctx context.Context, stepIDs []int64) (int64, error) {
	var total int64
	err := chunks(stepIDs, maxInList, func(c []int64) error {
		var n int64
		err := s.inTx(ctx, storage.OpDeleteOrphans, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			res, err := tx.ExecContext(ctx, expand(qDeleteStepCommands, len(c)), args(c)...)
			if err != nil {
				return err
			}
			n, err = res.RowsAffected()
			return err
		})
		total += n
		return err
	})
	if err != nil {
		return total, fmt.Errorf("deleting orphaned raw commands of steps %v: %w", stepIDs, err)
	}
	return total, nil
}

// RecordSweep stores what a sweep found, for every replica's gauges.
func (s *Storage) RecordSweep(ctx context.Context, uncollected int) error {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, qRecordState, "uncollected_steps", float64(uncollected)); err != nil {
		return fmt.Errorf("recording the sweep: %w", err)
	}
	return nil
}
