package mysql

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// formingLen is how many distinct ids the forming group holds.
func (r *releaseGroups) formingLen() int {
	n := 0
	r.runner.Forming(func(g *releaseSet) { n = len(g.ids) })
	return n
}

// A release that arrives while a run is in flight is not served by that
// run (it started before the release, so its check may predate the
// release's commit): it waits for the next run, which carries every release
// that arrived meanwhile, in one run. A step released twice is checked once.
func TestReleasesArrivingDuringARunWaitForTheNextOneAndShareIt(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var runs [][]int64
		firstStarted, releaseFirst := make(chan struct{}), make(chan struct{})
		run := func(_ context.Context, ids []int64) {
			mu.Lock()
			runs = append(runs, slices.Clone(ids))
			n := len(runs)
			mu.Unlock()
			if n == 1 {
				close(firstStarted)
				<-releaseFirst
			}
		}
		r := newReleaseGroups(run)
		ctx := t.Context()
		firstDone := make(chan struct{})
		go func() { r.collect(ctx, []int64{1, 1}); close(firstDone) }()
		<-firstStarted

		returned := make(chan int64, 3)
		for _, id := range []int64{2, 3, 4} {
			go func() { r.collect(ctx, []int64{id}); returned <- id }()
		}
		synctest.Wait() // every release has joined the forming group, or is stuck
		if n := r.formingLen(); n != 3 {
			t.Fatalf("the forming group holds %d ids once the releases wait, want 3", n)
		}
		close(releaseFirst)
		<-firstDone
		for range 3 {
			select {
			case <-returned:
			case <-time.After(15 * time.Second):
				t.Fatal("a release waited forever")
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if len(runs) != 2 {
			t.Fatalf("runs %v, want the first and one more for the releases that waited", runs)
		}
		if !slices.Equal(runs[0], []int64{1}) {
			t.Errorf("first run checked %v, want [1] (once)", runs[0])
		}
		slices.Sort(runs[1])
		if !slices.Equal(runs[1], []int64{2, 3, 4}) {
			t.Errorf("second run checked %v, want [2 3 4]", runs[1])
		}
	})
}

// The member that runs a group does so for all of its members: its own
// context ending does not cancel the run.
func TestAGroupsRunOutlivesTheContextOfTheMemberRunningIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var runErr error
	r := newReleaseGroups(func(rctx context.Context, _ []int64) {
		cancel()
		runErr = rctx.Err()
	})
	r.collect(ctx, []int64{7})
	if runErr != nil {
		t.Errorf("the run's context ended with its member's: %v", runErr)
	}
}
