package mysql_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

func outboxEvents(t *testing.T, b *bundle) map[string]events.Event {
	t.Helper()
	rows, err := b.db.Query(`SELECT event_id, event_type, step_id, enrollment_id, payload FROM stepcollect_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	byEnrollment := map[string]events.Event{}
	for rows.Next() {
		var id, typ, enrollment string
		var stepID int64
		var payload []byte
		if err := rows.Scan(&id, &typ, &stepID, &enrollment, &payload); err != nil {
			t.Fatal(err)
		}
		var ev events.Event
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatalf("event %s: %v", id, err)
		}
		if ev.EventID != id || ev.Type != typ || ev.Step.StepID != stepID || len(ev.Step.IDs) != 1 || ev.Step.IDs[0] != enrollment {
			t.Errorf("event %s: columns (%s, %d, %s) disagree with its payload %+v", id, typ, stepID, enrollment, ev)
		}
		if _, dup := byEnrollment[enrollment]; dup {
			t.Errorf("enrollment %s has two events", enrollment)
		}
		byEnrollment[enrollment] = ev
	}
	return byEnrollment
}

func TestEveryCompletionWritesExactlyOneEventWithItsResults(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := testkit.FanOut("outbox", 200, 2)
	stepID, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	startTogether(len(step.IDs)*2, func(i int) {
		id, cmd := step.IDs[i/2], step.Commands[i%2].CommandUUID
		if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(cmd)); err != nil {
			t.Errorf("%s/%s: %v", id, cmd, err)
		}
	})
	got := outboxEvents(t, b)
	if len(got) != len(step.IDs) {
		t.Fatalf("%d events for %d completions", len(got), len(step.IDs))
	}
	for _, id := range step.IDs {
		ev := got[id]
		if ev.Type != events.StepCompleted || ev.Step.StepID != stepID || ev.Step.WorkflowName != step.WorkflowName ||
			ev.EventID != testkit.EventID(t, b.db.DB, events.StepCompleted, stepID, id) || string(ev.Step.Context) != string(step.Context) {
			t.Errorf("%s: event %+v", id, ev)
		}
		if len(ev.Step.Commands) != 2 {
			t.Errorf("%s: %d commands", id, len(ev.Step.Commands))
		}
		for _, c := range ev.Step.Commands {
			if !c.Completed || string(c.Result) != string(testkit.CommandResult(c.CommandUUID).ResultReport) || c.RequestType != "DeviceInformation" {
				t.Errorf("%s: command %+v", id, c)
			}
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
}

// A lost COMMIT answer on the completing result: the retry returns the
// step, and the outbox holds its event once, not twice.
func TestLostCommitAnswerStillWritesOneEvent(t *testing.T) {
	t.Parallel()
	b, fc := setupFaulty(t)
	b = setup(t, &setupOpts{db: b.db, extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := b.stored(t, "lostevent", 1, 1)
	fc.arm(func(fc *faultConnector) { fc.loseCommits = 1 })
	r, err := b.answer(ctx, step, 0, 0)
	if err != nil || r == nil {
		t.Fatalf("%v, %v", r, err)
	}
	if fc.lost != 1 {
		t.Fatal("the fault never happened")
	}
	if got := outboxEvents(t, b); len(got) != 1 {
		t.Errorf("%d events, want 1", len(got))
	}
}

func TestTimeOutStepsWritesOneEventPerEnrollmentAsItStood(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := testkit.FanOut("tmo", 3, 2)
	step.Timeout = time.Now().Add(-time.Second)
	stepID, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	// one enrollment finished, one half, one nothing
	for _, c := range step.Commands {
		b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], testkit.CommandResult(c.CommandUUID))
	}
	b.answer(ctx, step, 1, 0)

	n, err := b.store.TimeOutSteps(ctx, time.Now())
	if err != nil || n != 2 {
		t.Fatalf("timed out %d, %v; want the 2 unfinished enrollments", n, err)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE event_type = 'step.timed_out'`); n != 2 {
		t.Errorf("%d step.timed_out events written, want 2", n)
	}
	got := outboxEvents(t, b)
	for _, id := range step.IDs[1:] {
		ev, ok := got[id]
		if !ok || ev.Type != events.StepTimedOut || ev.Step.StepID != stepID || ev.EventID != testkit.EventID(t, b.db.DB, events.StepTimedOut, stepID, id) {
			t.Fatalf("%s: %+v", id, ev)
		}
		done := 0
		for _, c := range ev.Step.Commands {
			if c.Completed {
				done++
			}
		}
		if want := map[string]int{step.IDs[1]: 1, step.IDs[2]: 0}[id]; done != want {
			t.Errorf("%s: %d commands completed in its event, want %d", id, done, want)
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows left: %+v", c)
	}
	if n, _ := b.store.TimeOutSteps(ctx, time.Now()); n != 0 {
		t.Errorf("timed out again: %d", n)
	}
}

func TestSendDueStepsWritesOneEventPerStepWithItsRawCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := testkit.FanOut("due", 4, 2)
	step.NotUntil = time.Now().Add(-time.Second)
	stepID, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	later := testkit.FanOut("later", 1, 1)
	later.NotUntil = time.Now().Add(time.Hour)
	if err := b.store.StoreStep(ctx, later, time.Now()); err != nil {
		t.Fatal(err)
	}
	n, err := b.store.SendDueSteps(ctx, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("sent %d, %v; want 1", n, err)
	}
	var payload []byte
	if err := b.db.QueryRow(`SELECT payload FROM stepcollect_outbox WHERE event_type = 'step.due'`).Scan(&payload); err != nil {
		t.Fatal(err)
	}
	var ev events.Event
	json.Unmarshal(payload, &ev)
	if ev.Step.StepID != stepID || len(ev.Step.IDs) != 4 || len(ev.Step.Commands) != 2 || string(ev.Step.Commands[0].Command) != "<plist/>" ||
		string(ev.Step.Context) != "ctx-due" || ev.Step.WorkflowName != step.WorkflowName || ev.Step.StepName != step.Name {
		t.Errorf("due event %+v", ev)
	}
	if n, _ := b.store.SendDueSteps(ctx, time.Now()); n != 0 {
		t.Errorf("sent twice: %d", n)
	}
	// the step is now an ordinary outstanding step: no raw commands, still there
	if c := countRows(t, b.db.DB); c.Steps != 2 || c.StepCommands != 1 {
		t.Errorf("after sending: %+v, want both steps and only the later one's raw command", c)
	}
}

// Ten dispatchers claiming at once: one of them gets the event, and
// nobody else until its lease lapses (a failed try's backoff ends); once
// acknowledged it is gone.
func TestClaimDueEventsIsExclusiveUntilItsLeaseRunsOut(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := testkit.FanOut("claim", 1, 1)
	b.store.StoreStep(ctx, step, time.Now())
	b.answer(ctx, step, 0, 0)

	claimed := make([][]*storage.OutboxEvent, 10)
	errs := make([]error, 10)
	startTogether(10, func(i int) {
		claimed[i], errs[i] = b.store.ClaimDueEvents(ctx, 10, time.Minute)
	})
	var ref storage.OutboxRef
	won := 0
	for i, evs := range claimed {
		if errs[i] != nil {
			t.Fatalf("claim %d: %v", i, errs[i])
		}
		for _, ev := range evs {
			won++
			ref = ev.OutboxRef
			if ev.Attempts != 1 || ev.Type != events.StepCompleted {
				t.Errorf("first claim: %+v, want attempt 1 of a step.completed", ev)
			}
		}
	}
	if won != 1 {
		t.Fatalf("the event was claimed %d times, want once", won)
	}
	if evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute); err != nil || len(evs) != 0 {
		t.Errorf("a leased event claimed again: %v, %v", evs, err)
	}
	if err := b.store.FailEvent(ctx, ref, "503 Service Unavailable", time.Now().Add(-time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute)
	if err != nil || len(evs) != 1 || evs[0].ID != ref.ID || evs[0].Attempts != 2 || evs[0].Type != events.StepCompleted {
		t.Fatalf("expired lease not claimed again (as the second attempt): %+v, %v", evs, err)
	}
	if err := b.store.AckEvents(ctx, []storage.OutboxRef{ref}); err != nil {
		t.Fatal(err)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox`); n != 0 {
		t.Errorf("%d pending after the ack", n)
	}
	if err := b.store.FailEvent(ctx, ref, "late", time.Now().Add(-time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute); err != nil || len(evs) != 0 {
		t.Errorf("a delivered event claimed again: %v, %v", evs, err)
	}
}

// A worker names each event it renews, acknowledges, fails or holds by
// its row and its event id. After a failover to an asynchronous replica
// that lost the last writes, the row a worker claimed may hold another
// event (the replica gave its id again): acting on the row id alone
// deleted that event undelivered (e2e/failover's replica test saw it).
// Here the claimed event's row is replaced by another event under the same
// id, and nothing the worker does to its claim may touch it.
func TestAWorkersAcknowledgementNamesItsEventNotJustTheRow(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	b.written(t, "reused", 1)
	claimed := b.claimOne(t)
	var stepID int64
	if err := b.db.QueryRow(`SELECT step_id FROM stepcollect_outbox WHERE id = ?`, claimed.ID).Scan(&stepID); err != nil {
		t.Fatal(err)
	}
	// what the promoted replica holds: another event under the same row id
	if _, err := b.db.Exec(`DELETE FROM stepcollect_outbox WHERE id = ?`, claimed.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.db.Exec(`INSERT INTO stepcollect_outbox (id, event_id, event_type, step_id, payload) VALUES (?, 'another-event', ?, ?, '{}')`,
		claimed.ID, events.StepCompleted, stepID); err != nil {
		t.Fatal(err)
	}
	for what, err := range map[string]error{
		"renew":       b.store.RenewLeases(ctx, []storage.OutboxRef{claimed.OutboxRef}, time.Hour),
		"fail":        b.store.FailEvent(ctx, claimed.OutboxRef, "late", time.Now().Add(time.Hour)),
		"hold":        b.store.HoldEvent(ctx, claimed.OutboxRef, "late"),
		"acknowledge": b.store.AckEvents(ctx, []storage.OutboxRef{claimed.OutboxRef}),
	} {
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	var eventID string
	var leased, failed, held bool
	err := b.db.QueryRow(`SELECT event_id, lease_until > CURRENT_TIMESTAMP(6), last_error IS NOT NULL, held_at IS NOT NULL FROM stepcollect_outbox WHERE id = ?`, claimed.ID).
		Scan(&eventID, &leased, &failed, &held)
	if err != nil {
		t.Fatalf("the other event under row %d: %v (acknowledged in the claimed event's place?)", claimed.ID, err)
	}
	if eventID != "another-event" || leased || failed || held {
		t.Errorf("the other event under row %d: %s, leased %v, failed %v, held %v; want it untouched", claimed.ID, eventID, leased, failed, held)
	}
}

// The claim writes attempts, lease_until and retry_at. An event is written
// with every one of them already the size the claim leaves it (the lease a
// value long lapsed, not NULL: migration 00011), and the operators'
// hold, release and "deliver now" put the lapsed value back, so that no
// claim grows a row: a row that grows is moved within its page, and the
// outbox's pages are full (measured: 5.4 KB of redo for the claim of one
// event on MariaDB 10.11 from NULL, 0.2 KB in place). The events are still
// due at once.
func TestEventsAreWrittenAtTheSizeTheirClaimLeavesThem(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	b.written(t, "sized", 20)
	unclaimedAsWritten := func(when string, want int) {
		t.Helper()
		got := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox
		WHERE lease_until IS NOT NULL AND lease_until < created_at AND retry_at IS NULL`)
		if got != want {
			t.Errorf("%s: %d events with a lapsed lease of their own size, want %d", when, got, want)
		}
	}
	unclaimedAsWritten("written", 20)
	evs, err := b.store.ClaimDueEvents(ctx, 100, time.Minute)
	if err != nil || len(evs) != 20 {
		t.Fatalf("claimed %d events as soon as written, %v; want 20", len(evs), err)
	}
	unclaimedAsWritten("claimed", 0)

	// an operator's hold and release, and "deliver now" after a failure
	held, failed := evs[0], evs[1]
	if err := b.store.HoldEvent(ctx, held.OutboxRef, "for the test"); err != nil {
		t.Fatal(err)
	}
	unclaimedAsWritten("held", 1)
	if _, err := b.store.ReleaseOrDeliverEvent(ctx, held.EventID); err != nil {
		t.Fatal(err)
	}
	if err := b.store.FailEvent(ctx, failed.OutboxRef, "refused", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := b.store.ReleaseOrDeliverEvent(ctx, failed.EventID); err != nil {
		t.Fatal(err)
	}
	unclaimedAsWritten("released and delivered now", 2)
	again, err := b.store.ClaimDueEvents(ctx, 100, time.Minute)
	if err != nil || len(again) != 2 {
		t.Fatalf("claimed %d events after the release and deliver-now, %v; want 2", len(again), err)
	}
}
