package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/micromdm/nanocmd/subsystem/cmdplan/storage"
)

// ErrCMDPlanNotFound is returned for a command plan never stored.
var ErrCMDPlanNotFound = errors.New("cmdplan not found")

// CMDPlans is NanoCMD's command plan storage: each plan as the JSON
// NanoCMD's kv backends store.
type CMDPlans struct{ db *sql.DB }

var _ storage.Storage = (*CMDPlans)(nil)

// NewCMDPlans returns the command plan storage on db (migrated by Migrate).
func NewCMDPlans(db *sql.DB) *CMDPlans { return &CMDPlans{db: db} }

// RetrieveCMDPlan returns the plan name, or ErrCMDPlanNotFound.
func (s *CMDPlans) RetrieveCMDPlan(ctx context.Context, name string) (*storage.CMDPlan, error) {
	var raw []byte
	err := s.db.QueryRowContext(ctx, qCMDPlan, name).Scan(&raw)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("retrieving cmdplan %s: %w", name, ErrCMDPlanNotFound)
	} else if err != nil {
		return nil, fmt.Errorf("retrieving cmdplan %s: %w", name, err)
	}
	p := &storage.CMDPlan{}
	if err := json.Unmarshal(raw, p); err != nil {
		return nil, fmt.Errorf("retrieving cmdplan %s: %w", name, err)
	}
	return p, nil
}

// StoreCMDPlan stores or replaces the plan name.
func (s *CMDPlans) StoreCMDPlan(ctx context.Context, name string, p *storage.CMDPlan) error {
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("storing cmdplan %s: %w", name, err)
	}
	if _, err := s.db.ExecContext(ctx, qStoreCMDPlan, name, b); err != nil {
		return fmt.Errorf("storing cmdplan %s: %w", name, err)
	}
	return nil
}

// DeleteCMDPlan deletes the plan name.
func (s *CMDPlans) DeleteCMDPlan(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, qDeleteCMDPlan, name); err != nil {
		return fmt.Errorf("deleting cmdplan %s: %w", name, err)
	}
	return nil
}
