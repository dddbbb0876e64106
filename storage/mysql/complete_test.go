package mysql_test

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// The completed step carries every command's result whole and in
// command_uuid order, whether the locking read brought the stored ones
// (up to 64 KiB) or they were read after it: results of 0, 10, 65536 and
// 65537 bytes, each answered before the last command of its step.
func TestACompletedStepCarriesEveryStoredResultWhole(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	for _, size := range []int{0, 10, 65536, 65537} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			step := b.stored(t, fmt.Sprintf("whole%d", size), 1, 3)
			bodies := [][]byte{bytes.Repeat([]byte{'a'}, size), bytes.Repeat([]byte{'b'}, 10), []byte("last")}
			var got *nanostorage.StepResult
			// the last command first, so that the stored ones are not all
			// in command order
			for _, c := range []int{2, 0, 1} {
				res, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], &nanostorage.StepCommandResult{
					CommandUUID: step.Commands[c].CommandUUID, RequestType: "DeviceInformation", ResultReport: bodies[c], Completed: true})
				if err != nil {
					t.Fatal(err)
				}
				if c != 1 && res != nil {
					t.Fatalf("step completed after command %d of 3", c)
				}
				got = res
			}
			if got == nil || len(got.Commands) != 3 {
				t.Fatalf("completed step: %+v, want the 3 commands' results", got)
			}
			// the reporting command first, then the others by command_uuid
			for i, c := range []int{1, 0, 2} {
				r := got.Commands[i]
				if r.CommandUUID != step.Commands[c].CommandUUID || !bytes.Equal(r.ResultReport, bodies[c]) || r.RequestType != "DeviceInformation" || !r.Completed {
					t.Errorf("result %d: command %s, %d bytes, %q, completed %v; want command %s, %d bytes",
						i, r.CommandUUID, len(r.ResultReport), r.RequestType, r.Completed, step.Commands[c].CommandUUID, len(bodies[c]))
				}
			}
		})
	}
}

// WithReceipts, each completion leaves its receipt (one row, the evidence
// a lost COMMIT answer is settled by); PruneReceipts takes those older
// than its age, and only those.
func TestACompletionsReceiptIsWrittenAndPrunedByAge(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithReceipts()}})
	ctx := t.Context()
	step := b.stored(t, "receipt", 3, 1)
	for i := range step.IDs {
		if r, err := b.answer(ctx, step, i, 0); err != nil || r == nil {
			t.Fatalf("enrollment %d: %v, %v; want its step completed", i, r, err)
		}
	}
	receipts := func() int {
		return testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_receipts`)
	}
	if n := receipts(); n != 3 {
		t.Fatalf("%d receipts, want one for each of the 3 completions", n)
	}
	if n, err := b.store.PruneReceipts(ctx, time.Hour); err != nil || n != 0 || receipts() != 3 {
		t.Fatalf("pruning receipts older than an hour: %d, %v, %d left; want none pruned", n, err, receipts())
	}
	testkit.WaitUntil(t, 15*time.Second, "the receipts 5 ms old by the server's clock (older)", func() (bool, any) {
		n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_receipts WHERE created_at < NOW(6) - INTERVAL 5000 MICROSECOND`)
		return n == 3, n
	})
	if n, err := b.store.PruneReceipts(ctx, 5*time.Millisecond); err != nil || n != 3 || receipts() != 0 {
		t.Fatalf("pruning receipts older than 5 ms: %d, %v, %d left; want all 3 pruned", n, err, receipts())
	}
}
