package mysql_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// written puts n step.completed events in the outbox, as completions do.
func (b *bundle) written(t *testing.T, prefix string, n int) {
	t.Helper()
	step := b.stored(t, prefix, n, 1)
	testkit.Complete(t, b.store, step, step.IDs...)
}

// claimOne claims the single due event, failing t otherwise.
func (b *bundle) claimOne(t *testing.T) *storage.OutboxEvent {
	t.Helper()
	evs, err := b.store.ClaimDueEvents(t.Context(), 10, time.Minute)
	if err != nil || len(evs) != 1 {
		t.Fatalf("claimed %d events, %v; want 1", len(evs), err)
	}
	return evs[0]
}

func (b *bundle) entry(t *testing.T, eventID string) storage.OutboxEntry {
	t.Helper()
	page, err := b.store.ListEvents(t.Context(), "", 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range page.Events {
		if e.EventID == eventID {
			return e
		}
	}
	t.Fatalf("event %s not listed", eventID)
	return storage.OutboxEntry{}
}

// A held event is never claimed again, is listed as held with its last
// error, and a release makes it pending and due with its count restarted.
func TestAHeldEventWaitsForItsReleaseAndThenStartsAfresh(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	b.written(t, "hold", 1)
	ev := b.claimOne(t)
	if ev.Age <= 0 || ev.Age > time.Minute {
		t.Errorf("a fresh event's age at claim is %v", ev.Age)
	}
	if err := b.store.HoldEvent(ctx, ev.OutboxRef, "callback answered 400 Bad Request"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(`UPDATE stepcollect_outbox SET lease_until = NULL`); err != nil { // as if every lease lapsed
		t.Fatal(err)
	}
	if evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute); err != nil || len(evs) != 0 {
		t.Fatalf("a held event claimed: %d, %v", len(evs), err)
	}
	e := b.entry(t, ev.EventID)
	if e.State != storage.EventHeld || e.Attempts != 1 || e.LastError == nil || *e.LastError != "callback answered 400 Bad Request" || e.NextAttemptAt != nil {
		t.Errorf("held event listed as %+v", e)
	}
	if g, err := b.store.Gauges(ctx); err != nil || g.OutboxHeld != 1 || g.OutboxPending != 1 || g.OldestEventAge != 0 {
		t.Errorf("gauges %+v, %v; want 1 held of 1 pending, and no age of an event waiting for delivery", g, err)
	}

	done, err := b.store.ReleaseOrDeliverEvent(ctx, ev.EventID)
	if err != nil || done != mysql.EventReleased {
		t.Fatalf("release: %q, %v", done, err)
	}
	e = b.entry(t, ev.EventID)
	if e.State != storage.EventPending || e.Attempts != 0 || e.LastError != nil {
		t.Errorf("released event listed as %+v", e)
	}
	again := b.claimOne(t)
	if again.ID != ev.ID || again.Attempts != 1 {
		t.Errorf("released event claimed as %+v, want its first attempt afresh", again)
	}
	if g, _ := b.store.Gauges(ctx); g.OutboxHeld != 0 || g.OldestEventAge <= 0 || g.OldestEventAge > time.Minute {
		t.Errorf("gauges after the release %+v: want none held, the released event's age counted from its release", g)
	}
}

// "Deliver now" ends a backoff; a delivery in flight is left alone, so
// the event is not posted twice at once; an unknown id is named.
func TestDeliverNowEndsABackoffButNotADeliveryInFlight(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	b.written(t, "now", 1)
	ev := b.claimOne(t)
	if done, err := b.store.ReleaseOrDeliverEvent(ctx, ev.EventID); err != nil || done != mysql.EventUnchanged {
		t.Fatalf("deliver now while in flight: %q, %v", done, err)
	}
	if evs, _ := b.store.ClaimDueEvents(ctx, 10, time.Minute); len(evs) != 0 {
		t.Fatal("an event in flight claimed again after deliver-now")
	}
	retry := time.Now().Add(time.Hour)
	if err := b.store.FailEvent(ctx, ev.OutboxRef, "callback answered 503 Service Unavailable", retry); err != nil {
		t.Fatal(err)
	}
	e := b.entry(t, ev.EventID)
	if e.State != storage.EventFailing || e.NextAttemptAt == nil || e.NextAttemptAt.Sub(retry).Abs() > time.Second || e.Attempts != 1 {
		t.Errorf("failing event listed as %+v (next attempt want %v)", e, retry)
	}
	if evs, _ := b.store.ClaimDueEvents(ctx, 10, time.Minute); len(evs) != 0 {
		t.Fatal("an event in its backoff claimed")
	}
	if done, err := b.store.ReleaseOrDeliverEvent(ctx, ev.EventID); err != nil || done != mysql.EventMadeDue {
		t.Fatalf("deliver now during a backoff: %q, %v", done, err)
	}
	if again := b.claimOne(t); again.ID != ev.ID || again.Attempts != 2 {
		t.Errorf("claimed %+v, want the second attempt", again)
	}
	_, err := b.store.ReleaseOrDeliverEvent(ctx, "no-such-event")
	if !errors.Is(err, storage.ErrEventNotFound) || !strings.Contains(err.Error(), `"no-such-event"`) {
		t.Errorf("unknown event: %v, want not found naming it", err)
	}
}

// Paging with any page size returns every event of a state exactly once,
// oldest first, and the states partition the outbox.
func TestListingEventsPagesEveryEventOnceOldestFirst(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	b.written(t, "page", 60)
	evs, err := b.store.ClaimDueEvents(ctx, 30, time.Minute)
	if err != nil || len(evs) != 30 {
		t.Fatalf("claimed %d, %v", len(evs), err)
	}
	for i, ev := range evs { // 10 held, 20 failing, 30 pending (never tried)
		if i < 10 {
			err = b.store.HoldEvent(ctx, ev.OutboxRef, "refused")
		} else {
			err = b.store.FailEvent(ctx, ev.OutboxRef, "refused", time.Now().Add(time.Hour))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{"": 60, storage.EventHeld: 10, storage.EventFailing: 20, storage.EventPending: 30}
	for state, n := range want {
		for _, limit := range []int{1, 7, 60, 1000} {
			seen := map[string]bool{}
			var after, last int64
			for pages := 0; ; pages++ {
				page, err := b.store.ListEvents(ctx, state, after, limit)
				if err != nil {
					t.Fatal(err)
				}
				if len(page.Events) > limit {
					t.Fatalf("state %q limit %d: a page of %d", state, limit, len(page.Events))
				}
				for _, e := range page.Events {
					if seen[e.EventID] || e.ID <= last || (state != "" && e.State != state) {
						t.Fatalf("state %q limit %d: %+v repeated, out of order or of another state", state, limit, e)
					}
					seen[e.EventID], last = true, e.ID
				}
				if page.After == 0 {
					break
				}
				after = page.After
			}
			if len(seen) != n {
				t.Errorf("state %q limit %d: %d events listed, want %d", state, limit, len(seen), n)
			}
		}
	}
	_, err = b.store.ListEvents(ctx, "stuck", 0, 10)
	if storage.ErrorCode(err) != storage.EInvalid || !strings.Contains(err.Error(), `"stuck"`) {
		t.Errorf("unknown state: %v, want invalid naming it", err)
	}
}

// A pause stops every claim (batched and by key) until resumed; "since"
// moves only when the state changes; the gauges show it.
func TestAPausedDeliveryClaimsNothingUntilResumed(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	st, err := b.store.DeliveryState(ctx)
	if err != nil || st.Paused || st.Since != nil {
		t.Fatalf("a fresh database's delivery: %+v, %v; want running, never paused", st, err)
	}
	b.written(t, "pause", 3)
	paused, err := b.store.SetDeliveryPaused(ctx, true)
	if err != nil || !paused.Paused || paused.Since == nil {
		t.Fatalf("pause: %+v, %v", paused, err)
	}
	if again, _ := b.store.SetDeliveryPaused(ctx, true); !again.Since.Equal(*paused.Since) {
		t.Errorf("a second pause moved since from %v to %v", paused.Since, again.Since)
	}
	if evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute); !errors.Is(err, storage.ErrDeliveryPaused) || len(evs) != 0 {
		t.Errorf("claim while paused: %d events, %v", len(evs), err)
	}
	if g, err := b.store.Gauges(ctx); err != nil || !g.DeliveryPaused {
		t.Errorf("gauges while paused: %+v, %v", g, err)
	}
	resumed, err := b.store.SetDeliveryPaused(ctx, false)
	if err != nil || resumed.Paused || resumed.Since == nil || resumed.Since.Before(*paused.Since) {
		t.Fatalf("resume: %+v, %v", resumed, err)
	}
	if evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute); err != nil || len(evs) != 3 {
		t.Errorf("claim after resume: %d events, %v", len(evs), err)
	}
	if g, _ := b.store.Gauges(ctx); g.DeliveryPaused {
		t.Error("gauges say paused after resume")
	}
}

// A probe claims the newest due event, or one from a random place in the
// outbox wrapping to the start; never one being delivered or held, nothing
// when none is due, and nothing while delivery is paused.
func TestAProbeClaimsTheNewestOrARandomDueEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	b.written(t, "probe", 6)
	var ids []int64
	rs, err := b.db.DB.QueryContext(ctx, `SELECT id FROM stepcollect_outbox ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rs.Next() {
		var id int64
		if err := rs.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	rs.Close()
	if len(ids) != 6 {
		t.Fatalf("%d events written, want 6", len(ids))
	}
	for _, want := range []int64{ids[5], ids[4]} {
		ev, err := b.store.ClaimProbeEvent(ctx, time.Minute, true)
		if err != nil || ev == nil || ev.ID != want || ev.Attempts != 1 {
			t.Fatalf("newest probe: %+v, %v; want row %d, its first attempt", ev, err, want)
		}
	}
	seen := map[int64]bool{}
	for range 4 {
		ev, err := b.store.ClaimProbeEvent(ctx, time.Minute, false)
		if err != nil || ev == nil || ev.ID > ids[3] || seen[ev.ID] {
			t.Fatalf("random probe: %+v, %v; want one of rows %v not claimed yet (claimed: %v)", ev, err, ids[:4], seen)
		}
		seen[ev.ID] = true
	}
	for _, newest := range []bool{true, false} {
		if ev, err := b.store.ClaimProbeEvent(ctx, time.Minute, newest); ev != nil || err != nil {
			t.Errorf("probe (newest %v) with every event leased: %+v, %v; want nothing", newest, ev, err)
		}
	}
	if _, err := b.store.SetDeliveryPaused(ctx, true); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ClaimProbeEvent(ctx, time.Minute, false); !errors.Is(err, storage.ErrDeliveryPaused) {
		t.Errorf("probe while paused: %v, want ErrDeliveryPaused", err)
	}
}

// Pauses and resumes sent at once (two operators, a double click) are
// applied one after the other, last writer standing: each is told the
// state its own write left, none fails. Read back apart from its write, a
// pause read a resume's state and answered 503 "did not stick".
func TestPausesAndResumesAtOnceEachGetTheirOwnState(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	if n := b.db.DB.Stats().MaxOpenConnections; n != 0 && n < 32 {
		t.Fatalf("the pool holds %d connections; the race needs 32 or more", n)
	}
	const callers, rounds = 32, 10
	for round := range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make(chan error, callers)
		for i := range callers {
			wg.Go(func() {
				<-start
				want := i%2 == 0
				st, err := b.store.SetDeliveryPaused(context.Background(), want)
				if err != nil {
					errs <- fmt.Errorf("round %d, caller %d (paused=%v): %w", round, i, want, err)
				} else if st.Paused != want || (want && st.Since == nil) {
					errs <- fmt.Errorf("round %d, caller %d asked paused=%v and was told %+v", round, i, want, st)
				}
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	}
}

// The claim reads through outbox_held_at, so thousands of held events at
// the head of the outbox cost it nothing: the rows it reads stay a handful.
func TestTheClaimDoesNotReadHeldEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := context.Background()
	const held = 3000
	for i := 0; i < held; i += 500 {
		var q strings.Builder
		q.WriteString(`INSERT INTO stepcollect_outbox (event_id, event_type, step_id, payload, attempts, held_at) VALUES `)
		for j := i; j < i+500; j++ {
			if j > i {
				q.WriteString(",")
			}
			fmt.Fprintf(&q, "('held-%d', 'step.completed', 1, '{}', 5, CURRENT_TIMESTAMP(6))", j)
		}
		if _, err := b.db.Exec(q.String()); err != nil {
			t.Fatal(err)
		}
	}
	b.written(t, "after", 5)
	// one connection, so that its session counters are the claim's
	one, err := mysql.OpenDB(b.db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	one.SetMaxOpenConns(1)
	store := testkit.OpenStorage(t, one, mysql.WithOutbox())
	reads := func() int64 {
		rows, err := one.QueryContext(ctx, `SHOW SESSION STATUS LIKE 'Handler_read%'`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var sum int64
		for rows.Next() {
			var name string
			var v int64
			if err := rows.Scan(&name, &v); err != nil {
				t.Fatal(err)
			}
			sum += v
		}
		return sum
	}
	before := reads()
	evs, err := store.ClaimDueEvents(ctx, 64, time.Minute)
	read := reads() - before
	if err != nil || len(evs) != 5 {
		t.Fatalf("claimed %d, %v; want the 5 not held", len(evs), err)
	}
	for i, ev := range evs {
		if i > 0 && ev.ID < evs[i-1].ID {
			t.Errorf("claimed out of order: %d after %d", ev.ID, evs[i-1].ID)
		}
	}
	if read > 300 {
		t.Errorf("the claim read %d rows with %d held events before the 5 due ones; want a handful", read, held)
	}
	t.Logf("rows read by the claim with %d held events: %d", held, read)
}

// The claim reads the pause with a shared lock of the state row: a claim
// that starts while a pause is being committed waits for it and claims
// nothing, and (the same lock seen from the other side) a pause waits for
// the claims that read "running" to commit. Once a pause has answered, no
// claim that saw delivery running is still open.
func TestAClaimWaitsForAPauseBeingCommittedAndHonoursIt(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	b.written(t, "race", 3)
	pause, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer pause.Rollback()
	if _, err := pause.ExecContext(ctx, `UPDATE stepcollect_delivery SET paused = 1, since = CURRENT_TIMESTAMP(6) WHERE id = 1`); err != nil {
		t.Fatal(err)
	}
	var answered atomic.Bool
	done := make(chan error, 1)
	go func() {
		evs, err := b.store.ClaimDueEvents(context.Background(), 10, time.Minute)
		answered.Store(true)
		if err == nil {
			err = fmt.Errorf("claimed %d events", len(evs))
		}
		done <- err
	}()
	if _, early := testkit.Watch(time.Now().Add(500*time.Millisecond), answered.Load); early {
		t.Fatalf("the claim went ahead of a pause being committed: %v", <-done)
	}
	if err := pause.Commit(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, storage.ErrDeliveryPaused) {
		t.Fatalf("the claim after the pause committed: %v, want it paused", err)
	}
}
