package mysql

import (
	"context"
	"sync"
)

// releaseGroups runs the inline collection (a storage without a
// Collector) for many callers at once, as group commit runs one log flush
// for many transactions: each caller's released steps join the group being
// formed, one member of the group checks and collects the whole group, and
// every member returns once a run that started after it joined has ended.
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
	token   chan struct{} // held by the member running a group
	mu      sync.Mutex
	forming *releaseGroup // the group new releases join; nil when none
}

type releaseGroup struct {
	ids  []int64
	seen map[int64]bool
	done chan struct{} // closed when the group's run has ended
}

func newReleaseGroups() *releaseGroups {
	return &releaseGroups{token: make(chan struct{}, 1)}
}

// collect adds stepIDs to the forming group and returns once a run of that
// group has ended (or ctx ends first: the group still runs, by another
// member or by the next caller's run). run gets the group's distinct ids.
func (r *releaseGroups) collect(ctx context.Context, stepIDs []int64, run func(context.Context, []int64)) {
	r.mu.Lock()
	g := r.forming
	if g == nil {
		g = &releaseGroup{seen: map[int64]bool{}, done: make(chan struct{})}
		r.forming = g
	}
	for _, id := range stepIDs {
		if !g.seen[id] {
			g.seen[id] = true
			g.ids = append(g.ids, id)
		}
	}
	r.mu.Unlock()

	select {
	case <-g.done:
		return
	case <-ctx.Done():
		return
	case r.token <- struct{}{}:
	}
	defer func() { <-r.token }()
	r.mu.Lock()
	if r.forming == g {
		r.forming = nil // sealed: whoever comes now forms the next group
	}
	r.mu.Unlock()
	select {
	case <-g.done: // a member before us ran it; both were ready
		return
	default:
	}
	run(context.WithoutCancel(ctx), g.ids)
	close(g.done)
}
