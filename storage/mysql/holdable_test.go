package mysql_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
)

// On a database NanoCMD made in utf8mb3, an id, command UUID or name with a
// character its column cannot hold (an emoji) matches no row: a result for
// it is a command no step holds, a cancel or a status read finds nothing,
// and the other ids of a read are answered. MariaDB answers such a value
// error 1267 (illegal mix of collations), which was a 500 or 503.
func TestAnIDTheColumnsCannotHoldMatchesNothing(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true, Charset: "utf8mb3"})
	loadNanoCMDSchema(t, db.DB)
	b := setup(t, &setupOpts{db: db, migrate: true})
	ctx := t.Context()
	step := b.stored(t, "hold", 1, 1)
	id, uuid, wf := step.IDs[0], step.Commands[0].CommandUUID, step.WorkflowName
	const emoji = "💻"

	for _, k := range [][2]string{{emoji, uuid}, {id, emoji}} {
		if rt, ok, err := b.store.RetrieveCommandRequestType(ctx, k[0], k[1]); err != nil || ok {
			t.Errorf("request type of (%s, %s): %q %v %v, want not found", k[0], k[1], rt, ok, err)
		}
		if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, k[0], testkit.CommandResult(k[1])); !errors.Is(err, storage.ErrUnknownCommand) {
			t.Errorf("result of (%s, %s): %v, want ErrUnknownCommand", k[0], k[1], err)
		}
	}
	for _, k := range [][2]string{{emoji, ""}, {emoji, wf}, {id, emoji}} {
		if err := b.store.CancelSteps(ctx, k[0], k[1]); err != nil {
			t.Errorf("cancelling (%s, %q): %v, want nil", k[0], k[1], err)
		}
	}
	if got, err := b.store.RetrieveOutstandingWorkflowStatus(ctx, wf, []string{emoji, id}); err != nil || !slices.Equal(got, []string{id}) {
		t.Errorf("outstanding of %s and %s: %v %v, want %s alone", emoji, id, got, err, id)
	}
	if got, err := b.store.RetrieveOutstandingWorkflowStatus(ctx, emoji, []string{id}); err != nil || len(got) != 0 {
		t.Errorf("outstanding of workflow %s: %v %v, want none", emoji, got, err)
	}
	if at, err := b.store.RetrieveWorkflowStarted(ctx, emoji, wf); err != nil || !at.IsZero() {
		t.Errorf("workflow started for %s: %v %v, want never", emoji, at, err)
	}
	if err := b.store.ClearWorkflowStatus(ctx, emoji); err != nil {
		t.Errorf("clearing %s's workflow status: %v", emoji, err)
	}
	if got, err := b.store.RetrieveEventSubscriptions(ctx, []string{emoji}); err != nil || len(got) != 0 {
		t.Errorf("event subscription %s: %v %v, want none", emoji, got, err)
	}
	if err := b.store.DeleteEventSubscription(ctx, emoji); err != nil {
		t.Errorf("deleting event subscription %s: %v", emoji, err)
	}
	if got, _, err := b.store.ListSteps(ctx, storage.StepFilter{WorkflowName: emoji, Limit: 10}); err != nil || len(got) != 0 {
		t.Errorf("steps of workflow %s: %v %v, want none", emoji, got, err)
	}
	if n, err := b.store.CancelWorkflowInstance(ctx, emoji, emoji); err != nil || n != 0 {
		t.Errorf("cancelling workflow %s: %d %v, want 0", emoji, n, err)
	}
	// storing one is refused as a value the database cannot hold
	bad := testkit.FanOut("hold-"+emoji, 1, 1)
	if err := b.store.StoreStep(ctx, bad, bad.NotUntil); storage.ErrorCode(err) != storage.EInvalid {
		t.Errorf("storing a step for %s: %v, want EInvalid", bad.IDs[0], err)
	}
	// the step of the id the columns hold is as it was
	if r, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(uuid)); err != nil || r == nil {
		t.Errorf("completing %s: %+v %v", id, r, err)
	}
}
