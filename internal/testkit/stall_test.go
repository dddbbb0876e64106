package testkit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// The probe counts the time its writes could not get through, and only
// that: a write held for a second (here by a row lock another session
// holds, as a stalled disk holds a commit) counts for about that long, the
// time around it for nothing, and a window before the hold sees none.
func TestTheStallProbeCountsWhatHeldItsWritesAndNothingElse(t *testing.T) {
	db := testkit.NewDB(t, nil)
	p := testkit.StartStallProbe(t, db.DB)

	began := time.Now()
	// the quiet window: ten writes through, about a second of them
	testkit.WaitUntil(t, 15*time.Second, "ten probe writes through (writes)", func() (bool, any) {
		n := p.Writes()
		return n >= 10, n
	})
	quiet := time.Now()
	if d := p.Stalled(began, quiet); d != 0 {
		t.Fatalf("stalled %v while nothing held the probe (%s), want 0", d, p)
	}

	const hold = 1500 * time.Millisecond
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.ExecContext(ctx, "SELECT n FROM testkit_stall_probe WHERE id = 1 FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	held := time.Now()
	time.Sleep(hold) // the fault itself: the probe's write held this long
	// a write under way counts as it goes: look while it is still held
	if d := p.Stalled(held, time.Now()); d < hold/2 {
		t.Errorf("stalled %v during a hold of %v, while it lasts (%s), want the write under way counted", d, hold, p)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	writes := p.Writes()
	// the held write goes through, and a few after it
	testkit.WaitUntil(t, 15*time.Second, "the held write and four more through (writes since the release)", func() (bool, any) {
		n := p.Writes() - writes
		return n >= 5, n
	})
	after := time.Now()

	d := p.Stalled(began, after)
	// the held write began within probeEvery of the hold and was through
	// once it was released; less than StallThreshold of it counts nothing,
	// so the whole is at least hold - probeEvery
	if lo, hi := hold-100*time.Millisecond, released.Sub(held)+200*time.Millisecond; d < lo || d > hi {
		t.Errorf("stalled %v over a hold of %v (%s), want between %v and %v", d, released.Sub(held).Round(time.Millisecond), p, lo, hi)
	}
	if d := p.Stalled(began, held.Add(-200*time.Millisecond)); d != 0 {
		t.Errorf("stalled %v in a window that ended before the hold, want 0", d)
	}
	if d := p.Stalled(released.Add(200*time.Millisecond), after); d != 0 {
		t.Errorf("stalled %v in a window that began after the hold, want 0", d)
	}
	t.Logf("%s; stalled %v over a hold of %v", p, d.Round(time.Millisecond), released.Sub(held).Round(time.Millisecond))
}
