package mysql

import (
	"context"

	"github.com/stepcollect/stepcollect/internal/group"
)

// releaseGroups runs the inline collection (a storage without a release
// sink) for many callers at once (internal/group): one member checks and
// collects the steps of the whole group. One check per result would be
// quadratic in a fan-out, each reading past every step_id entry the
// enrollments before it delete-marked. A member joins after its own COMMIT
// and its group is sealed only when its run starts, so the run sees what
// the member's own check would have, and the step is still collected
// before the member returns (docs/design.md, "How a result is committed",
// 2). A run is bounded by the storage's retries, not by one member's
// context: the others wait on it.
type releaseGroups struct {
	runner *group.Runner[*releaseSet]
}

// releaseSet is one group's distinct step ids, in arrival order.
type releaseSet struct {
	ids  []int64
	seen map[int64]bool
}

// newReleaseGroups runs each group's distinct ids with run.
func newReleaseGroups(run func(context.Context, []int64)) *releaseGroups {
	return &releaseGroups{runner: group.New(func() *releaseSet { return &releaseSet{seen: map[int64]bool{}} },
		func(ctx context.Context, g *releaseSet) { run(ctx, g.ids) })}
}

// collect adds stepIDs to the forming group and returns once a run of that
// group has ended (or ctx ends first: the group still runs, by another
// member or by the next caller's run).
func (r *releaseGroups) collect(ctx context.Context, stepIDs []int64) {
	r.runner.Do(ctx, func(g *releaseSet) {
		for _, id := range stepIDs {
			if !g.seen[id] {
				g.seen[id] = true
				g.ids = append(g.ids, id)
			}
		}
	})
}
