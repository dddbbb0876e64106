// Package group runs the small requests of many concurrent callers as one,
// as group commit writes many transactions with one log flush: each caller
// adds its part to the group being formed, the first member to get the
// turn seals the group and runs it, and every member returns once a run of
// its own group has ended.
//
// What it keeps: a member's group is sealed only when its run starts, and
// the member joined before that; so the run sees everything the member did
// before it joined (its own commit, say). A member that joins while a group
// runs goes into the next one: nothing waits for more than the run in
// progress and its own. One run at a time per Runner.
package group

import (
	"context"
	"sync"
)

// Runner forms and runs groups of type G (a struct of pointers or maps that
// add fills and run answers in).
type Runner[G any] struct {
	token    chan struct{} // held by the member running a group
	mu       sync.Mutex
	forming  *round[G] // the group new parts join; nil when none
	newGroup func() G
	run      func(context.Context, G)
}

type round[G any] struct {
	g    G
	done chan struct{} // closed when the group's run has ended
}

// New returns a Runner whose groups start as newGroup() and are run by
// run, with a context no member's cancellation ends (the other members
// still wait on it).
func New[G any](newGroup func() G, run func(context.Context, G)) *Runner[G] {
	return &Runner[G]{token: make(chan struct{}, 1), newGroup: newGroup, run: run}
}

// Do adds the caller's part to the forming group with add (called under
// the Runner's lock) and returns the group once its run has ended, for the
// caller to read its own answer in. If ctx ends first Do returns ctx's
// error; the group still runs, by another member or by the next caller.
func (r *Runner[G]) Do(ctx context.Context, add func(G)) (G, error) {
	r.mu.Lock()
	rd := r.forming
	if rd == nil {
		rd = &round[G]{g: r.newGroup(), done: make(chan struct{})}
		r.forming = rd
	}
	add(rd.g)
	r.mu.Unlock()

	select {
	case <-rd.done:
		return rd.g, nil
	case <-ctx.Done():
		var zero G
		return zero, ctx.Err()
	case r.token <- struct{}{}:
	}
	defer func() { <-r.token }()
	r.mu.Lock()
	if r.forming == rd {
		r.forming = nil // sealed: whoever comes now forms the next group
	}
	r.mu.Unlock()
	select {
	case <-rd.done: // a member before us ran it
		return rd.g, nil
	default:
	}
	r.run(context.WithoutCancel(ctx), rd.g)
	close(rd.done)
	return rd.g, nil
}

// Forming calls peek with the group being formed, if any (for tests).
func (r *Runner[G]) Forming(peek func(G)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.forming != nil {
		peek(r.forming.g)
	}
}
