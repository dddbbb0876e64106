package mysqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/micromdm/nanocmd/subsystem/inventory/storage"
)

// Inventory is NanoCMD's inventory storage: one JSON object of values per
// enrollment (as NanoCMD's kv backends store it), merged in one short
// transaction under that enrollment's row lock, so that merges from any
// number of replicas never lose one another's values.
type Inventory struct {
	db     *sql.DB
	groups *mergeGroups
}

var _ storage.Storage = (*Inventory)(nil)

// NewInventory returns the inventory storage on db (migrated by Migrate).
func NewInventory(db *sql.DB) *Inventory {
	s := &Inventory{db: db}
	s.groups = newMergeGroups(s.upsert)
	return s
}

// upsert merges each ids[i]'s flat values patches[i] in one statement.
func (s *Inventory) upsert(ctx context.Context, ids []string, patches [][]byte) error {
	args := make([]any, 0, 2*len(ids))
	for i, id := range ids {
		// a string: MySQL takes no JSON from a binary argument
		args = append(args, id, string(patches[i]))
	}
	op := "storing inventory of " + ids[0]
	if len(ids) > 1 {
		op += fmt.Sprintf(" and %d other enrollments", len(ids)-1)
	}
	return retry(ctx, op, func() error {
		_, err := s.db.ExecContext(ctx, upsertSQL(len(ids)), args...)
		return err
	})
}

// RetrieveInventory returns the values of the ids that have any.
func (s *Inventory) RetrieveInventory(ctx context.Context, opt *storage.SearchOptions) (map[string]storage.Values, error) {
	if opt == nil || len(opt.IDs) < 1 {
		return nil, storage.ErrNoIDs
	}
	ret := make(map[string]storage.Values, len(opt.IDs))
	err := chunks(opt.IDs, func(ids []string) error {
		rows, err := s.db.QueryContext(ctx, expand(qInventories, len(ids)), anys(ids)...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var id string
			var raw []byte
			if err := rows.Scan(&id, &raw); err != nil {
				return err
			}
			var v storage.Values
			if err := json.Unmarshal(raw, &v); err != nil {
				return fmt.Errorf("values of %s: %w", id, err)
			}
			ret[id] = v
		}
		return rows.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("retrieving inventory: %w", err)
	}
	return ret, nil
}

// StoreInventoryValues merges values into id's.
func (s *Inventory) StoreInventoryValues(ctx context.Context, id string, values storage.Values) error {
	if id == "" {
		return storage.ErrNoIDs
	}
	if len(values) == 0 {
		return nil
	}
	if ok, err := flat(values); err != nil {
		return fmt.Errorf("storing inventory of %s: %w", id, err)
	} else if ok {
		return s.groups.merge(ctx, id, values)
	}
	return inTx(ctx, s.db, "storing inventory of "+id, func(tx *sql.Tx) error {
		var raw []byte
		err := tx.QueryRowContext(ctx, qLockInventory, id).Scan(&raw)
		if errors.Is(err, sql.ErrNoRows) {
			// first values: a concurrent first insert makes this one a
			// duplicate key, and the retry merges into it
			b, err := json.Marshal(values)
			if err != nil {
				return fmt.Errorf("marshal values: %w", err)
			}
			_, err = tx.ExecContext(ctx, qInsertInventory, id, b)
			return err
		} else if err != nil {
			return err
		}
		merged := storage.Values{}
		if err := json.Unmarshal(raw, &merged); err != nil {
			return fmt.Errorf("stored values: %w", err)
		}
		for k, v := range values {
			merged[k] = v
		}
		b, err := json.Marshal(merged)
		if err != nil {
			return fmt.Errorf("marshal values: %w", err)
		}
		_, err = tx.ExecContext(ctx, qUpdateInventory, b, id)
		return err
	})
}

// flat reports whether no value of values is a JSON object or null (see
// patch), without marshaling the scalars the inventory workflows store.
func flat(values storage.Values) (bool, error) {
	for k, v := range values {
		switch v.(type) {
		case string, bool, time.Time, int, int32, int64, uint, uint32, uint64, float32, float64:
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return false, fmt.Errorf("value of %s: %w", k, err)
		}
		if scalar := len(b) > 0 && b[0] != '{' && string(b) != "null"; !scalar {
			return false, nil
		}
	}
	return true, nil
}

// patch is values as a JSON object, and whether a JSON merge patch of it
// replaces top-level keys as the Go merge does: none of its values is an
// object (a patch merges into it) or null (a patch deletes the key). The
// inventory workflows store strings, bools and times.
func patch(values storage.Values) ([]byte, bool, error) {
	b := []byte{'{'}
	for k, v := range values {
		key, err := json.Marshal(k)
		if err != nil {
			return nil, false, err
		}
		val, err := json.Marshal(v)
		if err != nil {
			return nil, false, fmt.Errorf("value of %s: %w", k, err)
		}
		if len(val) == 0 || val[0] == '{' || string(val) == "null" {
			return nil, false, nil
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = append(append(append(b, key...), ':'), val...)
	}
	return append(b, '}'), true, nil
}

// DeleteInventory deletes id's values.
func (s *Inventory) DeleteInventory(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, qDeleteInventory, id); err != nil {
		return fmt.Errorf("deleting inventory of %s: %w", id, err)
	}
	return nil
}
