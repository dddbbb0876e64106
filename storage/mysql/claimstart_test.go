package mysql_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// qTestEvent writes an event named by its two arguments (event and
// enrollment) straight into the outbox.
const qTestEvent = `INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload) VALUES (?, 'step.completed', 1, ?, '{}')`

// claimsSetup is a test database with the outbox whose storage's claims
// read from the start at least every every (and after a short claim).
func claimsSetup(t *testing.T, every time.Duration) *bundle {
	t.Helper()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	mysql.FullScanEvery(b.store, every)
	return b
}

// lateEvent writes an event in a transaction it leaves open, then the
// events named in after, committed: the open one holds the lowest row id
// and a claim now passes over it (SKIP LOCKED). commit commits it.
func lateEvent(t *testing.T, b *bundle, after ...string) (late string, commit func()) {
	t.Helper()
	ctx := t.Context()
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	late = "late"
	if _, err := tx.ExecContext(ctx, qTestEvent, late, late); err != nil {
		t.Fatal(err)
	}
	for _, id := range after {
		if _, err := b.db.ExecContext(ctx, qTestEvent, id, id); err != nil {
			t.Fatal(err)
		}
	}
	var done bool
	t.Cleanup(func() {
		if !done {
			tx.Rollback()
		}
	})
	return late, func() {
		t.Helper()
		done = true
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

func claimIDs(t *testing.T, s *mysql.Storage, limit int) []string {
	t.Helper()
	evs, err := s.ClaimDueEvents(context.Background(), limit, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]string, len(evs))
	for i, ev := range evs {
		ids[i] = ev.EventID
	}
	return ids
}

// An event whose transaction commits after a claim passed over its row
// (row ids are taken at INSERT and commit out of order) is still claimed,
// though later claims read only after the last row claimed: once a claim
// comes back short, the next one reads the outbox from its start.
func TestAnEventCommittedBehindAClaimIsClaimedOnceTheClaimsCatchUp(t *testing.T) {
	t.Parallel()
	b := claimsSetup(t, time.Hour) // only a short claim starts one here
	late, commit := lateEvent(t, b, "e1", "e2", "e3", "e4", "e5")

	if got := claimIDs(t, b.store, 2); !slices.Equal(got, []string{"e1", "e2"}) {
		t.Fatalf("first claim %v, want [e1 e2] (the open one skipped)", got)
	}
	commit()
	// read after e2: the committed late event is behind it
	if got := claimIDs(t, b.store, 2); !slices.Equal(got, []string{"e3", "e4"}) {
		t.Fatalf("second claim %v, want [e3 e4], read after the last row claimed", got)
	}
	if got := claimIDs(t, b.store, 2); !slices.Equal(got, []string{"e5"}) {
		t.Fatalf("third claim %v, want [e5]", got)
	}
	// the third came back short: this one reads from the start
	if got := claimIDs(t, b.store, 2); !slices.Equal(got, []string{late}) {
		t.Fatalf("claim after a short one %v, want [%s]: the event committed behind the claims is never claimed", got, late)
	}
}

// Claims that always come back full (a worker behind a long burst) still
// read the outbox from its start at least every so often: an event behind
// them waits that long, not for the burst to end.
func TestClaimsThatNeverCatchUpStillReadFromTheStartEverySoOften(t *testing.T) {
	t.Parallel()
	const every = 300 * time.Millisecond
	b := claimsSetup(t, every)
	var rest []string
	for i := range 40 { // more than the claims in every, a claim each 20 ms
		rest = append(rest, fmt.Sprintf("e%02d", i))
	}
	late, commit := lateEvent(t, b, rest...)

	if got := claimIDs(t, b.store, 1); !slices.Equal(got, []string{"e00"}) {
		t.Fatalf("first claim %v, want [e00] (the open one skipped)", got)
	}
	commit()
	n := 0
	testkit.WaitUntil(t, 15*time.Second, "the late event claimed, one event a claim (claims)", func() (bool, any) {
		got := claimIDs(t, b.store, 1)
		if len(got) != 1 {
			t.Fatalf("claim %d returned %v: the claims caught up before the late event came", n, got)
		}
		n++
		return got[0] == late, n
	})
}

// A lapsed lease below the last row claimed is claimed again: the claim
// that finds nothing else due reads from the start.
func TestALapsedLeaseBehindTheLastClaimIsClaimedAgain(t *testing.T) {
	t.Parallel()
	b := claimsSetup(t, time.Hour)
	ctx := t.Context()
	for _, id := range []string{"a", "b", "c"} {
		if _, err := b.db.ExecContext(ctx, qTestEvent, id, id); err != nil {
			t.Fatal(err)
		}
	}
	// a lease long enough that a loaded CI cannot let it lapse before the
	// second claim, which must see it held
	first, err := b.store.ClaimDueEvents(ctx, 1, 1500*time.Millisecond)
	if err != nil || len(first) != 1 || first[0].EventID != "a" {
		t.Fatalf("first claim %v, %v; want [a]", first, err)
	}
	if got := claimIDs(t, b.store, 2); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("second claim %v, want [b c]", got)
	}
	testkit.WaitUntil(t, 15*time.Second, "a's lease lapsed by the clock claims use (leases left)", func() (bool, any) {
		n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE event_id = 'a' AND lease_until > ?`, time.Now())
		return n == 0, n
	})
	var got []*storage.OutboxEvent
	for range 2 { // the first may still read after c; the one after a short claim reads from the start
		if got, err = b.store.ClaimDueEvents(ctx, 2, time.Minute); err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			break
		}
	}
	if len(got) != 1 || got[0].EventID != "a" || got[0].Attempts != 2 {
		t.Fatalf("after a's lease lapsed the claims returned %+v, want a as its second attempt", got)
	}
}

// After a failover to a replica that lost the last writes, new events get
// row ids the worker already claimed. A full scan's last row is where
// later claims read after, not the highest row ever claimed: else every
// other claim would read past all the new events and come back empty.
func TestClaimsReadAfterWhereAFullScanEndedNotTheHighestRowEver(t *testing.T) {
	t.Parallel()
	b := claimsSetup(t, time.Hour)
	ctx := t.Context()
	insert := func(id int, event string) {
		t.Helper()
		if _, err := b.db.ExecContext(ctx, `INSERT INTO stepcollect_outbox (id, event_id, event_type, step_id, enrollment_id, payload) VALUES (?, ?, 'step.completed', 1, ?, '{}')`, id, event, event); err != nil {
			t.Fatal(err)
		}
	}
	insert(10, "old10")
	insert(11, "old11")
	evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute)
	if err != nil || len(evs) != 2 {
		t.Fatalf("claiming the old events: %v, %v", evs, err)
	}
	if err := b.store.AckEvents(ctx, []storage.OutboxRef{evs[0].OutboxRef, evs[1].OutboxRef}); err != nil {
		t.Fatal(err)
	}
	// the replica gives ids below the ones claimed
	for i, id := range []int{5, 6, 7, 8} {
		insert(id, fmt.Sprintf("new%d", i))
	}
	if got := claimIDs(t, b.store, 2); !slices.Equal(got, []string{"new0", "new1"}) {
		t.Fatalf("first claim after the failover %v, want [new0 new1]", got)
	}
	if got := claimIDs(t, b.store, 2); !slices.Equal(got, []string{"new2", "new3"}) {
		t.Fatalf("second claim after the failover %v, want [new2 new3], read after where the first ended", got)
	}
}

// Events committed out of order by many writers at once, claimed and
// acknowledged by four claimers at once the whole time: every event is
// claimed once, though most claims read only after the last row claimed
// (full scans here only when a claim comes back short).
func TestOutOfOrderCommitsUnderConcurrentClaimsAreAllClaimedOnce(t *testing.T) {
	t.Parallel()
	b := claimsSetup(t, time.Hour)
	ctx := t.Context()
	const writers, each = 8, 100
	committed := make(chan struct{}, 1) // a writer committed since a claimer last looked
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				tx, err := b.db.BeginTx(ctx, nil)
				if err != nil {
					t.Error(err)
					return
				}
				id := fmt.Sprintf("w%d-%d", w, i)
				if _, err := tx.ExecContext(ctx, qTestEvent, id, id); err != nil {
					tx.Rollback()
					t.Error(err)
					return
				}
				time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond) // commit later than others that took higher ids
				if err := tx.Commit(); err != nil {
					t.Error(err)
					return
				}
				select {
				case committed <- struct{}{}:
				default:
				}
			}
		}()
	}
	written := make(chan struct{})
	go func() { wg.Wait(); close(written) }()
	var mu sync.Mutex
	seen := map[string]int{}
	deadline := time.Now().Add(15 * time.Second)
	var claimers sync.WaitGroup
	for range 4 {
		claimers.Add(1)
		go func() {
			defer claimers.Done()
			for time.Now().Before(deadline) {
				evs, err := b.store.ClaimDueEvents(ctx, 8, time.Minute)
				if err != nil {
					t.Error(err)
					return
				}
				refs := make([]storage.OutboxRef, len(evs))
				mu.Lock()
				for i, ev := range evs {
					seen[ev.EventID]++
					refs[i] = ev.OutboxRef
				}
				done := len(seen) == writers*each
				mu.Unlock()
				if len(refs) > 0 {
					if err := b.store.AckEvents(ctx, refs); err != nil {
						t.Error(err)
						return
					}
				}
				if done {
					return
				}
				if len(evs) < 8 { // short: claim again once a writer commits more
					select {
					case <-committed:
					case <-written:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	claimers.Wait()
	var missing []string
	for w := range writers {
		for i := range each {
			id := fmt.Sprintf("w%d-%d", w, i)
			if n := seen[id]; n != 1 {
				missing = append(missing, fmt.Sprintf("%s claimed %d times", id, n))
			}
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of %d events not claimed exactly once within 15 s, e.g. %v", len(missing), writers*each, missing[:min(5, len(missing))])
	}
}
