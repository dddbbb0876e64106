package testkit

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
)

// post delivers ev to r as the worker does: its id in the header and the
// body.
func post(t *testing.T, r *Receiver, ev events.Event) {
	t.Helper()
	body, _ := json.Marshal(ev)
	req, _ := http.NewRequest(http.MethodPost, r.URL, bytes.NewReader(body))
	req.Header.Set("X-Stepcollect-Event-Id", ev.EventID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("event %s answered %s", ev.EventID, resp.Status)
	}
}

func completion(stepID int64, enrollment string) events.Event {
	return events.Event{EventID: events.ID(1, events.StepCompleted, stepID, enrollment), Type: events.StepCompleted,
		Step: events.Step{StepID: stepID, IDs: []string{enrollment}}}
}

// The bench's view of a receiver: completions counted apart from other
// events, duplicates counted but not as distinct, and a wait that returns
// when they are all in or when they stall.
func TestReceiverCompletions(t *testing.T) {
	t.Parallel()
	r := NewReceiver(t, ReceiverOptions{})
	post(t, r, completion(1, "A"))
	post(t, r, completion(1, "A")) // a redelivery
	post(t, r, completion(1, "B"))
	post(t, r, events.Event{EventID: events.ID(1, events.StepDue, 2, ""), Type: events.StepDue, Step: events.Step{StepID: 2}})

	posts, distinct, last := r.Completions()
	if posts != 3 || distinct != 2 {
		t.Errorf("Completions: %d posts, %d distinct, want 3 and 2", posts, distinct)
	}
	if arr := r.CompletionArrivals(); len(arr) != 2 || !arr[1].Equal(last) || arr[0].After(arr[1]) {
		t.Errorf("CompletionArrivals %v, want 2 in order ending at %v", arr, last)
	}
	if got := r.Distinct(); got != 3 {
		t.Errorf("Distinct %d, want 3 (the step.due counts there)", got)
	}
	if !r.AwaitCompletions(2, time.Minute, time.Minute) {
		t.Error("AwaitCompletions(2) after 2 arrived: false")
	}

	// one more arrives while waiting for it: once the wait below waits
	go func() {
		Watch(time.Now().Add(15*time.Second), func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			return r.doneNews != nil
		})
		post(t, r, completion(1, "C"))
	}()
	if !r.AwaitCompletions(3, time.Minute, time.Minute) {
		t.Error("AwaitCompletions(3) with the third arriving: false")
	}

	// none more comes: the wait gives up after the stall, long before
	// the limit
	start := time.Now()
	if r.AwaitCompletions(4, 200*time.Millisecond, time.Minute) {
		t.Error("AwaitCompletions(4) with 3 sent: true")
	}
	if took := time.Since(start); took > 15*time.Second {
		t.Errorf("AwaitCompletions gave up after %v, want about the 200 ms stall", took)
	}
	r.Check(t)
}
