package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/stepcollect/stepcollect/internal/group"
	"github.com/stepcollect/stepcollect/storage"
)

// lookups reads the request types that concurrent RetrieveCommandRequestType
// calls ask for in one statement (internal/group): NanoCMD's engine asks
// before every result it stores, so in a fan-out of results dozens ask at
// once, each a round trip of its own where one serves them all.
//
// The statement is a UNION ALL of the single lookup, one branch per asker
// (each a primary-key point read returning the asker's index), so each
// answer is exactly the one the single statement would give, whatever the
// collation; it starts after every asker joined, so it sees what each of
// them would have seen.
type lookups = group.Runner[*lookupSet]

type lookupKey struct{ id, uuid string }

// lookupSet is one group: its askers' keys, and once read, the request
// type of each key found, or the error that failed the read.
type lookupSet struct {
	keys  []lookupKey
	index map[lookupKey]int
	types map[int]string
	err   error
}

// maxLookups bounds one statement's branches.
const maxLookups = 200

func (s *Storage) newLookups() *lookups {
	return group.New(func() *lookupSet { return &lookupSet{index: map[lookupKey]int{}} }, s.readRequestTypes)
}

// readRequestTypes answers every key of g, maxLookups to a statement.
func (s *Storage) readRequestTypes(ctx context.Context, g *lookupSet) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	g.types = make(map[int]string, len(g.keys))
	for from := 0; from < len(g.keys); from += maxLookups {
		keys := g.keys[from:min(from+maxLookups, len(g.keys))]
		args := make([]any, 0, 3*len(keys))
		branches := make([]string, len(keys))
		for i, k := range keys {
			branches[i] = qGetRequestTypeBranch
			args = append(args, from+i, k.id, k.uuid)
		}
		err := func() error {
			rs, err := s.db.QueryContext(ctx, strings.Join(branches, " UNION ALL "), args...)
			if err != nil {
				return err
			}
			defer rs.Close()
			for rs.Next() {
				var i int
				var rt string
				if err := rs.Scan(&i, &rt); err != nil {
					return err
				}
				g.types[i] = rt
			}
			return rs.Err()
		}()
		if err != nil {
			g.err = err
			return
		}
	}
}

// RetrieveCommandRequestType returns the request type of id's command uuid,
// and whether id holds such a command at all (whether a workflow sent it).
// Concurrent calls share one read (lookups); when that read fails, each
// asks alone, so that an error is its own.
func (s *Storage) RetrieveCommandRequestType(ctx context.Context, id string, uuid string) (string, bool, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	if id == "" || uuid == "" {
		return "", false, storage.Errorf(storage.EInvalid, "request type lookup: empty enrollment id or command uuid")
	}
	if !s.holds(ctx, id, uuid) {
		return "", false, nil // and kept out of the others' shared read
	}
	key := lookupKey{id, uuid}
	var at int
	g, err := s.lookups.Do(ctx, func(g *lookupSet) {
		i, ok := g.index[key]
		if !ok {
			i = len(g.keys)
			g.index[key] = i
			g.keys = append(g.keys, key)
		}
		at = i
	})
	if err == nil && g.err == nil {
		rt, ok := g.types[at]
		return rt, ok, nil
	}
	var rt string
	err = s.db.QueryRowContext(ctx, qGetRequestType, id, uuid).Scan(&rt)
	if errors.Is(err, sql.ErrNoRows) {
		return "", false, nil
	} else if err != nil {
		return "", false, fmt.Errorf("request type (enrollment %s, command %s): %w", id, uuid, err)
	}
	return rt, true, nil
}
