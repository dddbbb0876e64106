package mysqlstore

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/micromdm/nanocmd/subsystem/profile/storage"
)

// Profiles is NanoCMD's profile storage on its own subsystem_profiles
// table, so a NanoCMD database's profiles carry over.
type Profiles struct{ db *sql.DB }

var _ storage.Storage = (*Profiles)(nil)

// NewProfiles returns the profile storage on db (migrated by Migrate).
func NewProfiles(db *sql.DB) *Profiles { return &Profiles{db: db} }

// RetrieveRawProfiles returns the raw profiles by name; ErrProfileNotFound
// names the first one missing.
func (s *Profiles) RetrieveRawProfiles(ctx context.Context, names []string) (map[string][]byte, error) {
	if len(names) < 1 {
		return nil, storage.ErrNoNames
	}
	ret := make(map[string][]byte, len(names))
	err := chunks(names, func(names []string) error {
		rows, err := s.db.QueryContext(ctx, expand(qRawProfiles, len(names)), anys(names)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var raw []byte
			if err := rows.Scan(&name, &raw); err != nil {
				return err
			}
			ret[name] = raw
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("retrieving raw profiles: %w", err)
	}
	return ret, missing(names, func(n string) bool { _, ok := ret[n]; return ok })
}

// RetrieveProfileInfos returns the profiles' metadata by name, or every
// profile's when names is empty.
func (s *Profiles) RetrieveProfileInfos(ctx context.Context, names []string) (map[string]storage.ProfileInfo, error) {
	ret := make(map[string]storage.ProfileInfo, len(names))
	read := func(q string, args []any) error {
		rows, err := s.db.QueryContext(ctx, q, args...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var name string
			var info storage.ProfileInfo
			if err := rows.Scan(&name, &info.Identifier, &info.UUID); err != nil {
				return err
			}
			ret[name] = info
		}
		return rows.Err()
	}
	var err error
	if len(names) == 0 {
		err = read(qAllProfileInfos, nil)
	} else {
		err = chunks(names, func(names []string) error { return read(expand(qProfileInfos, len(names)), anys(names)) })
	}
	if err != nil {
		return nil, fmt.Errorf("retrieving profile infos: %w", err)
	}
	return ret, missing(names, func(n string) bool { _, ok := ret[n]; return ok })
}

func missing(names []string, found func(string) bool) error {
	for _, n := range names {
		if !found(n) {
			return fmt.Errorf("%w: %s: missing from result set", storage.ErrProfileNotFound, n)
		}
	}
	return nil
}

// StoreProfile stores or replaces the profile name.
func (s *Profiles) StoreProfile(ctx context.Context, name string, info storage.ProfileInfo, raw []byte) error {
	if _, err := s.db.ExecContext(ctx, qStoreProfile, name, info.Identifier, info.UUID, raw); err != nil {
		return fmt.Errorf("storing profile %s: %w", name, err)
	}
	return nil
}

// DeleteProfile deletes the profile name. Deleting one that is not there
// is not an error: NanoCMD v0.7.1's own storages (kv and mysql) answer
// nil, and its DELETE /v1/profile/{name} a 204, for any name.
func (s *Profiles) DeleteProfile(ctx context.Context, name string) error {
	if _, err := s.db.ExecContext(ctx, qDeleteProfile, name); err != nil {
		return fmt.Errorf("deleting profile %s: %w", name, err)
	}
	return nil
}
