package e2e

import (
	"bytes"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/mdmplist/plisttest"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

// A device may answer in a binary plist, and an engine's context is any
// bytes: both reach the step.completed event as sent, through a step of
// two commands (the first result is stored, not completed, which is where
// a text column refused a binary plist with a 400, and NanoMDM does not
// send a result twice).
func TestBinaryResultsAndContextReachTheEventAsSent(t *testing.T) {
	// the binaries migrate the database themselves, as a deployment's do
	db, rs := testkit.NewDB(t, &testkit.DBOptions{Empty: true}), testkit.StartRedis(t)
	s := testkit.StartStack(t, testkit.StackConfig{
		DSN: db.DSN, RedisURL: rs.URL, DB: db.DB, APIKey: apiKey,
		Env: []string{"STEPCOLLECT_LOG_LEVEL=warn"}, Receiver: &testkit.ReceiverOptions{},
	})
	const id = "BIN-DEVICE-1"
	context := []byte("\x00\xd3\x01not UTF-8\xff")
	stepID := s.Client.MustEnqueue(t, map[string]any{
		"workflow_name": "io.stepcollect.e2e.binary", "instance_id": "binary-1", "step_name": "query",
		"context": base64.StdEncoding.EncodeToString(context),
		"ids":     []string{id},
		"commands": []map[string]string{
			{"command_uuid": "BIN-CMD-1", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="},
			{"command_uuid": "BIN-CMD-2", "request_type": "SecurityInfo", "command": "PHBsaXN0Lz4="},
		},
	})
	results := map[string][]byte{}
	for _, uuid := range []string{"BIN-CMD-1", "BIN-CMD-2"} {
		results[uuid] = plisttest.ResultBinary("Acknowledged", uuid, id)
		status, body, err := s.Client.Webhook(testkit.WebhookBody(id, uuid, results[uuid]))
		if err != nil || status != 200 {
			t.Fatalf("%s's binary plist result: %d %s %v, want 200", uuid, status, body, err)
		}
	}
	testkit.WaitUntil(t, 15*time.Second, "the step.completed event (events received)", func() (bool, any) {
		return s.Rcv.Distinct() == 1, s.Rcv.Distinct()
	})
	for _, ev := range s.Rcv.Events() {
		if ev.Type != events.StepCompleted || ev.Step.StepID != stepID || len(ev.Step.IDs) != 1 || ev.Step.IDs[0] != id {
			t.Fatalf("event %+v", ev)
		}
		if !bytes.Equal(ev.Step.Context, context) {
			t.Errorf("context %q, want %q", ev.Step.Context, context)
		}
		if len(ev.Step.Commands) != 2 {
			t.Fatalf("commands %+v", ev.Step.Commands)
		}
		for _, c := range ev.Step.Commands {
			if !c.Completed || !bytes.Equal(c.Result, results[c.CommandUUID]) {
				t.Errorf("%s: completed %v, result %q, want the binary plist sent, %q", c.CommandUUID, c.Completed, c.Result, results[c.CommandUUID])
			}
		}
	}
	s.WantEvents = 1
	s.CheckReceiver(t)
	s.Stop(t)
}
