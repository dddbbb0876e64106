package mysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/stepcollect/stepcollect/storage"
)

// stateEngineOwner, present in stepcollect_state, marks a database whose
// step timeouts, re-pushes and NotUntil belong to NanoCMD's engine worker
// (cmd/nanocmd). It is never removed by stepcollect: a database once used
// by cmd/nanocmd holds steps that only NanoCMD's engine understands.
const stateEngineOwner = "schedule_owner_nanocmd"

// MarkScheduleOwnedByEngine marks the database as cmd/nanocmd's, so that
// stepcollect's scheduler (cmd/worker's -schedule-interval) never claims
// its steps. cmd/nanocmd calls it at start, before it serves.
func (s *Storage) MarkScheduleOwnedByEngine(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, qRecordState, stateEngineOwner, 1.0); err != nil {
		return fmt.Errorf("marking the schedule as NanoCMD's engine's: %w", err)
	}
	return nil
}

// scheduleOwnedElsewhere returns ErrScheduleOwnedByEngine on a database
// MarkScheduleOwnedByEngine marked. The scheduler asks before it claims
// (to claim nothing) and again inside each claim's transaction, after the
// claim: a mark committed in between rolls the claim back, and a mark
// committed later postdates every step claimed, so none of them is one
// NanoCMD's engine stored.
func scheduleOwnedElsewhere(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}) error {
	var n int
	if err := q.QueryRowContext(ctx, qStateExists, stateEngineOwner).Scan(&n); err != nil {
		return fmt.Errorf("reading the schedule's owner: %w", err)
	}
	if n > 0 {
		return storage.ErrScheduleOwnedByEngine
	}
	return nil
}
