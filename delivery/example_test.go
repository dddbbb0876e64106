package delivery_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/delivery"
	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
)

// Receiver is the workflow engine's end of the callbacks, as docs/engines.md's
// "Receiving" shows it: verify the signature over the raw body, then
// handle each event_id once, acknowledging duplicates without handling
// them again.
type Receiver struct {
	Key []byte // the worker's -callback-hmac-key

	mu   sync.Mutex
	seen map[string]bool // in production: a table with a unique key on event_id,
	// written in the same transaction as what the event changes
}

func (rc *Receiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	if err != nil {
		http.Error(w, "reading the body", http.StatusBadRequest)
		return
	}
	mac := hmac.New(sha256.New, rc.Key)
	mac.Write(body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(r.Header.Get("X-Stepcollect-Signature")), []byte(want)) {
		http.Error(w, "bad signature", http.StatusUnauthorized)
		return
	}
	var ev struct {
		EventID string `json:"event_id"`
		Type    string `json:"type"` // step.completed, step.timed_out, step.due
		Step    struct {
			StepID       int64    `json:"step_id"`
			WorkflowName string   `json:"workflow_name"`
			InstanceID   string   `json:"instance_id"`
			StepName     string   `json:"step_name"`
			IDs          []string `json:"ids"`
			Commands     []struct {
				CommandUUID string `json:"command_uuid"`
				RequestType string `json:"request_type"`
				Completed   bool   `json:"completed"`
				Result      []byte `json:"result"` // the device's result plist
			} `json:"commands"`
		} `json:"step"`
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.EventID == "" {
		http.Error(w, "not an event", http.StatusBadRequest) // stepcollect tries again later
		return
	}

	rc.mu.Lock()
	defer rc.mu.Unlock()
	if rc.seen[ev.EventID] {
		fmt.Println("again:", ev.EventID, "(acknowledged, not handled twice)")
		w.WriteHeader(http.StatusOK) // a redelivery of something already handled
		return
	}
	// Handle it: advance the workflow instance ev.Step.InstanceID.
	fmt.Printf("%s: %s step %q of %s for %v, %d command(s)\n", ev.EventID, ev.Type, ev.Step.StepName, ev.Step.InstanceID, ev.Step.IDs, len(ev.Step.Commands))
	if rc.seen == nil {
		rc.seen = map[string]bool{}
	}
	rc.seen[ev.EventID] = true
	w.WriteHeader(http.StatusNoContent) // any 2xx acknowledges; only once the event is durably handled
}

// outbox is a stand-in for the storage's outbox holding one event whose
// acknowledgement is lost once: the dispatcher's first two claims get it,
// the third nothing, and tells drained.
type outbox struct {
	ev      *storage.OutboxEvent
	claims  int
	drained chan struct{}
}

func (o *outbox) ClaimDueEvents(context.Context, int, time.Duration) ([]*storage.OutboxEvent, error) {
	o.claims++
	switch {
	case o.claims <= 2:
		return []*storage.OutboxEvent{o.ev}, nil
	case o.claims == 3:
		close(o.drained)
	}
	return nil, nil
}
func (o *outbox) RenewLeases(context.Context, []storage.OutboxRef, time.Duration) error { return nil }
func (o *outbox) AckEvents(context.Context, []storage.OutboxRef) error                  { return nil }
func (o *outbox) FailEvent(context.Context, storage.OutboxRef, string, time.Time) error { return nil }
func (o *outbox) HoldEvent(context.Context, storage.OutboxRef, string) error            { return nil }

// The Receiver above, fed by stepcollect's own dispatcher: the event is
// handled once though it is delivered twice, and a body signed with
// another key is refused.
func Example_receiver() {
	key := []byte("the -callback-hmac-key")
	srv := httptest.NewServer(&Receiver{Key: key})
	defer srv.Close()

	ev := events.FromStepResult(1, events.StepCompleted, 42, &nanostorage.StepResult{
		StepContext: nanostorage.StepContext{WorkflowName: "io.example.inventory", InstanceID: "run-1", Name: "query"},
		IDs:         []string{"DEV-1"},
		Commands:    []nanostorage.StepCommandResult{{CommandUUID: "U-1", RequestType: "DeviceInformation", Completed: true, ResultReport: []byte("<plist/>")}},
	}, time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	payload, _ := json.Marshal(ev)
	ref := storage.OutboxRef{ID: 1, EventID: ev.EventID, Type: ev.Type, Attempts: 1}
	store := &outbox{ev: &storage.OutboxEvent{OutboxRef: ref, Payload: payload}, drained: make(chan struct{})}
	d := delivery.New(delivery.Config{URL: srv.URL, HMACKey: key}, metrics.NewDelivery(prometheus.NewRegistry(), events.StepCompleted), zerolog.Nop())
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		// one loop: the claims, and so the deliveries, come one after another
		delivery.NewDispatcher(delivery.DispatchConfig{Loops: 1, PollInterval: time.Millisecond}, d, store).Run(ctx)
		close(done)
	}()
	<-store.drained // delivered, then delivered again (an acknowledgement lost on the way back)
	stop()
	<-done

	forged, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(string(payload)))
	forged.Header.Set(delivery.SignatureHeader, delivery.Sign([]byte("another key"), payload))
	resp, err := http.DefaultClient.Do(forged)
	if err != nil {
		log.Fatal(err)
	}
	resp.Body.Close()
	fmt.Println("signed with another key:", resp.Status)
	// Output:
	// 99a5f384d58d7206da8270f83e2fd535: step.completed step "query" of run-1 for [DEV-1], 1 command(s)
	// again: 99a5f384d58d7206da8270f83e2fd535 (acknowledged, not handled twice)
	// signed with another key: 401 Unauthorized
}
