package group_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stepcollect/stepcollect/internal/group"
)

type ids struct{ list []int }

// Parts that arrive while a run is in flight are not served by it (it
// started before they joined): they wait for the next run, which carries
// every part that arrived meanwhile, in one run; each caller gets the group
// its part was run in.
func TestPartsArrivingDuringARunShareTheNextRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var runs [][]int
		firstStarted, releaseFirst := make(chan struct{}), make(chan struct{})
		r := group.New(func() *ids { return &ids{} }, func(_ context.Context, g *ids) {
			mu.Lock()
			runs = append(runs, slices.Clone(g.list))
			n := len(runs)
			mu.Unlock()
			if n == 1 {
				close(firstStarted)
				<-releaseFirst
			}
		})
		add := func(id int) func(*ids) { return func(g *ids) { g.list = append(g.list, id) } }
		ctx := t.Context()
		firstDone := make(chan struct{})
		go func() { r.Do(ctx, add(1)); close(firstDone) }()
		<-firstStarted

		got := make(chan []int, 3)
		for _, id := range []int{2, 3, 4} {
			go func() {
				g, err := r.Do(ctx, add(id))
				if err != nil {
					t.Error(err)
				}
				got <- g.list
			}()
		}
		formed(t, r, 3)
		close(releaseFirst)
		<-firstDone
		for range 3 {
			select {
			case g := <-got:
				slices.Sort(g)
				if !slices.Equal(g, []int{2, 3, 4}) {
					t.Errorf("a caller's group ran %v, want [2 3 4]", g)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("a caller never returned")
			}
		}
		if len(runs) != 2 {
			t.Errorf("%d runs (%v), want 2: the first, then one for all three", len(runs), runs)
		}
	})
}

// A caller whose context ends returns its error at once; its part is still
// run (the run's context is not the caller's), by the next caller.
func TestACancelledCallersPartStillRuns(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		busy, release := make(chan struct{}), make(chan struct{})
		var ran [][]int
		var mu sync.Mutex
		r := group.New(func() *ids { return &ids{} }, func(ctx context.Context, g *ids) {
			if ctx.Err() != nil {
				t.Error("the run's context ended with a caller's")
			}
			mu.Lock()
			ran = append(ran, slices.Clone(g.list))
			mu.Unlock()
			if slices.Contains(g.list, 1) {
				close(busy)
				<-release
			}
		})
		go r.Do(t.Context(), func(g *ids) { g.list = append(g.list, 1) })
		<-busy
		ctx, cancel := context.WithCancel(t.Context())
		errc := make(chan error, 1)
		go func() {
			_, err := r.Do(ctx, func(g *ids) { g.list = append(g.list, 2) })
			errc <- err
		}()
		formed(t, r, 1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled caller: %v, want context.Canceled", err)
		}
		close(release)
		g, err := r.Do(t.Context(), func(g *ids) { g.list = append(g.list, 3) })
		if err != nil || !slices.Contains(g.list, 2) || !slices.Contains(g.list, 3) {
			t.Fatalf("next caller's group %v, %v: want the cancelled part 2 run with 3", g, err)
		}
	})
}

// The run is not cut short when the member running it is cancelled: the
// other members of its group wait on it.
func TestARunOutlivesItsRunnersContext(t *testing.T) {
	t.Parallel()
	running, cancelled := make(chan struct{}), make(chan struct{})
	var runErr error
	r := group.New(func() *ids { return &ids{} }, func(ctx context.Context, _ *ids) {
		close(running)
		<-cancelled
		runErr = ctx.Err()
	})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { r.Do(ctx, func(g *ids) { g.list = append(g.list, 1) }); close(done) }()
	<-running
	cancel()
	close(cancelled)
	<-done
	if runErr != nil {
		t.Errorf("the run's context ended with its runner's: %v", runErr)
	}
}

// formed checks that the forming group holds n parts once every goroutine
// of the test's bubble is blocked: the callers have joined it and wait.
func formed(t *testing.T, r *group.Runner[*ids], n int) {
	t.Helper()
	synctest.Wait()
	k := 0
	r.Forming(func(g *ids) { k = len(g.list) })
	if k != n {
		t.Fatalf("the forming group holds %d parts once its callers wait, want %d", k, n)
	}
}
