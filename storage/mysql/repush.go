package mysql

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/stepcollect/stepcollect/storage"
)

// RetrieveAndMarkRePushed returns the enrollments with a command last pushed
// before ifBefore and marks those commands pushed at pushTime. Rows are
// claimed with SKIP LOCKED, so two workers never return the same enrollment
// for the same commands.
func (s *Storage) RetrieveAndMarkRePushed(ctx context.Context, ifBefore time.Time, pushTime time.Time) ([]string, error) {
	ids, err := s.rePush(ctx, ifBefore, pushTime, nil)
	if err != nil {
		return nil, err
	}
	return ids, nil
}

// ClaimRePushes is RetrieveAndMarkRePushed for cmd/worker's scheduler: on
// a database cmd/nanocmd marked it returns ErrScheduleOwnedByEngine and
// claims nothing, as SendDueSteps and TimeOutSteps do (NanoCMD's engine
// worker re-pushes there). On an error it also returns the enrollments of
// the batches that committed: they are marked, so they are due a push now.
func (s *Storage) ClaimRePushes(ctx context.Context, ifBefore time.Time, pushTime time.Time) ([]string, error) {
	if err := scheduleOwnedElsewhere(ctx, s.db); err != nil {
		return nil, err
	}
	return s.rePush(ctx, ifBefore, pushTime, func(ctx context.Context, tx *sql.Tx) error {
		return scheduleOwnedElsewhere(ctx, tx)
	})
}

// rePush claims and marks in batches; check, when set, runs in each batch's
// transaction after the claim, and its error rolls the batch back. On an
// error it returns the enrollments of the batches that committed.
func (s *Storage) rePush(ctx context.Context, ifBefore, pushTime time.Time, check func(context.Context, *sql.Tx) error) ([]string, error) {
	if ifBefore.IsZero() {
		return nil, nil
	}
	seen := map[string]bool{}
	var out []string
	type key struct{ id, uuid string }
	for {
		var keys []key
		err := s.inTx(ctx, storage.OpRePush, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			var err error
			keys, err = queryList(ctx, tx, qClaimRePush, []any{dbTime(ifBefore), rePushRowsPerBatch}, func(rs *sql.Rows) (key, error) {
				var k key
				return k, rs.Scan(&k.id, &k.uuid)
			})
			if err != nil {
				return fmt.Errorf("claiming rows to re-push: %w", err)
			}
			if len(keys) == 0 {
				return nil
			}
			if check != nil {
				if err := check(ctx, tx); err != nil {
					keys = nil
					return err
				}
			}
			vals := []any{pushTime}
			for _, k := range keys {
				vals = append(vals, k.id, k.uuid)
			}
			_, err = tx.ExecContext(ctx, expand(qMarkRePushed, len(keys)), vals...)
			if err != nil {
				return fmt.Errorf("marking rows re-pushed: %w", err)
			}
			return nil
		})
		if err != nil {
			return out, fmt.Errorf("re-push (before %s): %w", ifBefore.Format(time.RFC3339), err)
		}
		for _, k := range keys {
			if !seen[k.id] {
				seen[k.id] = true
				out = append(out, k.id)
			}
		}
		// A pushTime not after ifBefore leaves the rows due: one pass only.
		if len(keys) < rePushRowsPerBatch || !pushTime.After(ifBefore) {
			return out, nil
		}
	}
}
