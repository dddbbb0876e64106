package mysql_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

const mib = 1 << 20

// bigResult is a completed result for uuid of n bytes.
func bigResult(uuid string, n int) *nanostorage.StepCommandResult {
	return &nanostorage.StepCommandResult{CommandUUID: uuid, Completed: true, ResultReport: bytes.Repeat([]byte("r"), n)}
}

// allocated is how many bytes the process allocated while fn ran
// (runtime.MemStats.TotalAlloc): a memory bound, not a timing one.
func allocated(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// fortyMiBStep stores one enrollment's 40-command step and the 1 MiB
// results of its first n commands.
func fortyMiBStep(t testing.TB, b *bundle, prefix string, n int) *nanostorage.StepEnqueuingWithConfig {
	t.Helper()
	step := testkit.FanOut(prefix, 1, 40)
	if err := b.store.StoreStep(context.Background(), step, time.Now()); err != nil {
		t.Fatal(err)
	}
	for c := range n {
		if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(context.Background(), step.IDs[0], bigResult(step.Commands[c].CommandUUID, mib)); err != nil {
			t.Fatalf("result %d: %v", c, err)
		}
	}
	return step
}

// A result that is not its enrollment's last reads none of the results
// stored before it: with 38 MiB stored, the 39th 1 MiB result's call
// allocates a few MiB (its own statement), not the 38 MiB again.
func TestANonFinalResultDoesNotReadTheResultsStoredBeforeIt(t *testing.T) {
	// not parallel: it reads the process's allocation counters, which
	// parallel tests would add to (Go runs it before the parallel ones)
	b := setup(t, nil)
	step := fortyMiBStep(t, b, "mem", 38)
	var err error
	n := allocated(func() {
		_, err = b.store.StoreCommandResponseAndRetrieveCompletedStep(t.Context(), step.IDs[0], bigResult(step.Commands[38].CommandUUID, mib))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n > 8*mib {
		t.Errorf("the 39th 1 MiB result (38 MiB stored) allocated %.1f MiB, want under 8 MiB", float64(n)/mib)
	}
	t.Logf("the 39th 1 MiB result allocated %.1f MiB", float64(n)/mib)
}

// The storage call of the 39th and of the 40th (last) 1 MiB result of a
// 40-command step: bytes allocated per call (B/call).
//
//	go test ./storage/mysql -run '^$' -bench StoreFortyMiB -benchtime 3x
func BenchmarkStoreFortyMiBStep(b *testing.B) {
	for _, bc := range []struct {
		name   string
		stored int
	}{{"39th", 38}, {"40th", 39}} {
		b.Run(bc.name, func(b *testing.B) {
			bu := setup(b, nil)
			var total uint64
			for i := range b.N {
				b.StopTimer()
				step := fortyMiBStep(b, bu, fmt.Sprintf("bench-%s-%d", bc.name, i), bc.stored)
				b.StartTimer()
				var err error
				total += allocated(func() {
					_, err = bu.store.StoreCommandResponseAndRetrieveCompletedStep(context.Background(), step.IDs[0], bigResult(step.Commands[bc.stored].CommandUUID, mib))
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(total)/float64(b.N)/mib, "MiB/call")
		})
	}
}
