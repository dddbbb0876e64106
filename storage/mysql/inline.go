package mysql

import (
	"context"

	"github.com/stepcollect/stepcollect/internal/group"
)

// releaseGroups runs the inline collection (a storage without a release
// sink) for many callers at once (internal/group): each caller's released
// steps join the group being formed, one member of the group checks and
// collects the whole group, and every member returns once a run that
// started after it joined has ended.
//
// Why: the reference check of a step that a fan-out is releasing reads the
// step_id index past every entry the enrollments before it delete-marked,
// each of which a consistent read must look up in the clustered index (its
// page was just modified) to find it deleted. One check per result is
// quadratic in the fan-out: at N=3000 on MySQL 9.7 the check was the
// costliest statement of the whole result path (140 ms on average, more
// than the COMMIT), and a step each paid a claim transaction, a second
// durable commit, per result. Grouped, a fan-out is checked a few times in
// all and a burst of one-step releases is claimed and deleted in one
// transaction.
//
// What it keeps: a member's group is sealed only when its run starts, and
// a member joins before that, after its own COMMIT; so the run's check sees
// the member's deletes, as the member's own check would have. The last
// enrollment of a step therefore still sees it unreferenced, and a step is
// still collected before StoreCommandResponseAndRetrieveCompletedStep or
// CancelSteps returns. One run at a time per Storage; a run is not cancelled
// by one member's context (the others still wait on it), only bounded by
// the storage's own retries.
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
