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
			return nil, fmt.Errorf("re-push (before %s): %w", ifBefore.Format(time.RFC3339), err)
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
