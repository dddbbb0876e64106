package mysqlstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/micromdm/nanocmd/subsystem/inventory/storage"

	"github.com/stepcollect/stepcollect/internal/group"
)

// mergeGroups writes the flat inventory merges of many callers at once
// (internal/group): each caller's values join the group being formed, one
// member writes the whole group in one upsert, and every member returns
// once that write has ended, with its own enrollment's outcome.
//
// Why: the inventory workflow merges twice into each enrollment in the
// request of its last result (SecurityInfo's event, then the step's
// DeviceInformation), each merge a durable commit of its own; in a
// fan-out of results they come dozens at a time. One statement for all
// of them is one round trip and one commit where there were dozens (see
// docs/benchmarks.md, "NanoCMD's server and stepcollect's nanocmd").
//
// What it keeps: a member returns only after the statement holding its
// values has committed (or failed, and then with its error).
type mergeGroups struct {
	runner *group.Runner[*mergeSet]
	write  func(ctx context.Context, ids []string, patches [][]byte) error
}

// mergeSet is one group: the values of each enrollment, merged in arrival
// order, and, once written, each enrollment's outcome.
type mergeSet struct {
	values map[string]storage.Values
	errs   map[string]error
}

// maxGroup bounds one upsert: rows, and bytes of values (under the
// smallest max_allowed_packet in use, 4 MiB on MySQL 5.7's default).
const (
	maxGroupRows  = 500
	maxGroupBytes = 1 << 20
)

func newMergeGroups(write func(ctx context.Context, ids []string, patches [][]byte) error) *mergeGroups {
	m := &mergeGroups{write: write}
	m.runner = group.New(func() *mergeSet { return &mergeSet{values: map[string]storage.Values{}} },
		func(ctx context.Context, g *mergeSet) { g.errs = m.writeGroup(ctx, g.values) })
	return m
}

// merge adds id's values to the forming group and returns once the group
// has been written: nil when id's values are committed.
func (m *mergeGroups) merge(ctx context.Context, id string, values storage.Values) error {
	g, err := m.runner.Do(ctx, func(g *mergeSet) {
		if v, ok := g.values[id]; ok {
			maps.Copy(v, values)
		} else {
			g.values[id] = maps.Clone(values)
		}
	})
	if err != nil {
		return fmt.Errorf("storing inventory of %s: %w", id, err)
	}
	return g.errs[id]
}

// writeGroup writes values in upserts of at most maxGroupRows rows and
// maxGroupBytes, by enrollment id (every writer locks rows in one order).
// An upsert that fails is written again one enrollment at a time, so that
// one enrollment's refusal is its own.
func (m *mergeGroups) writeGroup(ctx context.Context, values map[string]storage.Values) map[string]error {
	errs := map[string]error{}
	ids := slices.Sorted(maps.Keys(values))
	var chunkIDs []string
	var chunk [][]byte
	size := 0
	flush := func() {
		if len(chunkIDs) == 0 {
			return
		}
		if err := m.write(ctx, chunkIDs, chunk); err != nil {
			for i, id := range chunkIDs {
				if len(chunkIDs) == 1 {
					errs[id] = err
				} else {
					errs[id] = m.write(ctx, chunkIDs[i:i+1], chunk[i:i+1])
				}
			}
		}
		chunkIDs, chunk, size = nil, nil, 0
	}
	for _, id := range ids {
		p, ok, err := patch(values[id])
		if err != nil || !ok {
			// merge admits only flat values, which marshal
			errs[id] = fmt.Errorf("storing inventory of %s: values not flat: %v", id, err)
			continue
		}
		if len(chunkIDs) == maxGroupRows || size+len(p) > maxGroupBytes {
			flush()
		}
		chunkIDs, chunk, size = append(chunkIDs, id), append(chunk, p), size+len(p)
	}
	flush()
	return errs
}

// upsertSQL is the merge of n enrollments' flat values in one statement.
func upsertSQL(n int) string {
	return qMergeInventories + strings.TrimSuffix(strings.Repeat("(?, ?),", n), ",") + qMergeInventoriesTail
}
