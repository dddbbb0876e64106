package mysql_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
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
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := fanOutStep("outbox", 200, 2)
	stepID, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	startTogether(len(step.IDs)*2, func(i int) {
		id, cmd := step.IDs[i/2], step.Commands[i%2].CommandUUID
		if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, result(cmd)); err != nil {
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
			ev.EventID != events.ID(events.StepCompleted, stepID, id) || string(ev.Step.Context) != string(step.Context) {
			t.Errorf("%s: event %+v", id, ev)
		}
		if len(ev.Step.Commands) != 2 {
			t.Errorf("%s: %d commands", id, len(ev.Step.Commands))
		}
		for _, c := range ev.Step.Commands {
			if !c.Completed || string(c.Result) != string(result(c.CommandUUID).ResultReport) || c.RequestType != "DeviceInformation" {
				t.Errorf("%s: command %+v", id, c)
			}
		}
	}
	if c := countRows(t, b.db.DB); c != (rowCounts{}) {
		t.Errorf("rows left: %+v", c)
	}
}

// A lost COMMIT answer on the completing result: the retry returns the
// step, and the outbox holds its event once, not twice.
func TestLostCommitAnswerStillWritesOneEvent(t *testing.T) {
	b, fc := setupFaulty(t)
	b = setup(t, &setupOpts{db: b.db, noMigrate: true, extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	step := fanOutStep("lostevent", 1, 1)
	if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	fc.mu.Lock()
	fc.loseCommits = 1
	fc.mu.Unlock()
	r, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], result(step.Commands[0].CommandUUID))
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

func TestStepStatusCountsOutstandingEnrollmentsUntilCollected(t *testing.T) {
	b := setup(t, nil)
	ctx := t.Context()
	step := fanOutStep("status", 3, 2)
	id, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.store.StepStatus(ctx, id)
	if err != nil || st.OutstandingIDs != 3 || st.WorkflowName != step.WorkflowName || st.StepName != "step" || st.CreatedAt.IsZero() {
		t.Fatalf("status %+v, %v", st, err)
	}
	for _, c := range step.Commands {
		b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], result(c.CommandUUID))
	}
	if st, _ := b.store.StepStatus(ctx, id); st.OutstandingIDs != 2 {
		t.Errorf("outstanding %d after one enrollment finished, want 2", st.OutstandingIDs)
	}
	for _, e := range step.IDs[1:] {
		b.store.CancelSteps(ctx, e, "")
	}
	if _, err := b.store.StepStatus(ctx, id); storage.ErrorCode(err) != storage.ENotFound {
		t.Errorf("after collection: %v, want not found", err)
	}
}
