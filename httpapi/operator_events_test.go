package httpapi_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
)

// completedEvents writes n step.completed events through the webhook.
func (b *bundle) completedEvents(t *testing.T, n int) {
	t.Helper()
	ids := make([]string, n)
	for i := range ids {
		ids[i] = testkit.EnrollmentID("ev", i)
	}
	b.enqueue(t, "io.example.events", ids, "U-EV")
	w := b.sender(nil)
	for _, id := range ids {
		if err := sendResult(w, id, "U-EV", "Acknowledged"); err != nil {
			t.Fatal(err)
		}
	}
}

// claimAll claims every due event, as a worker would before a delivery.
func (b *bundle) claimAll(t *testing.T) []*storage.OutboxEvent {
	t.Helper()
	evs, err := b.store.ClaimDueEvents(t.Context(), 1000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return evs
}

// listAll follows next from the first page of GET /v1/events?query to
// the last, failing t on anything but 200.
func (b *bundle) listAll(t *testing.T, query string) (evs []map[string]any, pages int) {
	t.Helper()
	after := ""
	for {
		path := "/v1/events?" + query
		if after != "" {
			path += "&after=" + url.QueryEscape(after)
		}
		status, body := b.client.V1(t, "GET", path, nil)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %v", path, status, body)
		}
		pages++
		for _, e := range body["events"].([]any) {
			evs = append(evs, e.(map[string]any))
		}
		next, ok := body["next"].(string)
		if !ok {
			if body["next"] != nil {
				t.Fatalf("GET %s: next %v is not a string", path, body["next"])
			}
			return evs, pages // absent on the last page, as on every list
		}
		after = next
	}
}

// GET /v1/events lists the outbox by state, every field of the reference
// present, and paging across pages returns every event exactly once,
// oldest first.
func TestV1EventsListsTheOutboxByStatePagingEveryEventOnce(t *testing.T) {
	b := setup(t, nil)
	b.completedEvents(t, 25)
	claimed := b.claimAll(t)
	for i, ev := range claimed[:10] { // 4 held, 6 failing, 15 pending
		var err error
		if i < 4 {
			err = b.store.HoldEvent(t.Context(), ev.OutboxRef, "callback answered 400 Bad Request")
		} else {
			err = b.store.FailEvent(t.Context(), ev.OutboxRef, "callback answered 503 Service Unavailable", time.Now().Add(time.Hour))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.Exec(`UPDATE stepcollect_outbox SET lease_until = NULL, attempts = 0 WHERE id > ?`, claimed[9].ID); err != nil {
		t.Fatal(err) // the other 15 as never claimed
	}
	for state, want := range map[string]int{"": 25, "held": 4, "failing": 6, "pending": 15} {
		evs, pages := b.listAll(t, "limit=4&state="+state)
		if len(evs) != want || pages != (want+3)/4 {
			t.Errorf("state %q: %d events in %d pages, want %d in %d", state, len(evs), pages, want, (want+3)/4)
		}
		seen := map[string]bool{}
		last := ""
		for _, e := range evs {
			id := e["event_id"].(string)
			if seen[id] {
				t.Errorf("state %q: event %s listed twice", state, id)
			}
			seen[id] = true
			for _, k := range []string{"event_id", "type", "step_id", "enrollment_id", "created_at", "attempts", "last_error", "next_attempt_at", "state"} {
				if _, ok := e[k]; !ok {
					t.Errorf("state %q: event %s has no %q", state, id, k)
				}
			}
			if state != "" && e["state"] != state {
				t.Errorf("state %q: event %s is %v", state, id, e["state"])
			}
			if c := e["created_at"].(string); c < last {
				t.Errorf("state %q: %s listed after a newer event", state, c)
			} else {
				last = c
			}
			switch e["state"] {
			case "held":
				if e["last_error"] != "callback answered 400 Bad Request" || e["attempts"] != 1.0 || e["next_attempt_at"] != nil {
					t.Errorf("held event %v", e)
				}
			case "failing":
				if e["next_attempt_at"] == nil || e["last_error"] == nil {
					t.Errorf("failing event %v: no next attempt or error", e)
				}
			case "pending":
				if e["attempts"] != 0.0 || e["last_error"] != nil || e["type"] != "step.completed" {
					t.Errorf("pending event %v", e)
				}
			}
		}
	}
	if evs, pages := b.listAll(t, ""); len(evs) != 25 || pages != 1 {
		t.Errorf("default page: %d events in %d pages, want all 25 in one", len(evs), pages)
	}
}

// Bad paging or a bad state is a 400 naming the parameter and the value.
func TestV1EventsRefusesBadInputNamingIt(t *testing.T) {
	b := setup(t, nil)
	for q, want := range map[string][]string{
		"limit=1001":          {"limit", "1001", "1000"},
		"limit=100000000000":  {"limit", "100000000000"},
		"limit=0":             {"limit", `"0"`},
		"limit=ten":           {"limit", `"ten"`},
		"state=stuck":         {"state", `"stuck"`},
		"after=not-a-cursor!": {"after", "not-a-cursor!"},
		"after=MA":            {"after"}, // "0"
	} {
		status, body := b.client.V1(t, "GET", "/v1/events?"+q, nil)
		msg, _ := body["error"].(string)
		if status != http.StatusBadRequest {
			t.Errorf("?%s: %d %v, want 400", q, status, body)
		}
		for _, w := range want {
			if !strings.Contains(msg, w) {
				t.Errorf("?%s: %q does not name %s", q, msg, w)
			}
		}
	}
	if status, _ := testkit.NewClient(b.srv.URL, "wrong").V1(t, "GET", "/v1/events", nil); status != http.StatusUnauthorized {
		t.Errorf("without the key: %d", status)
	}
}

// POST /v1/events/{id}/deliver releases a held event (pending again,
// attempts restarted) or ends a failing one's backoff; 202 either way;
// an unknown event is a 404 naming it.
func TestV1DeliverReleasesAHeldEventOrMakesAFailingOneDue(t *testing.T) {
	b := setup(t, nil)
	b.completedEvents(t, 2)
	evs := b.claimAll(t)
	if err := b.store.HoldEvent(t.Context(), evs[0].OutboxRef, "callback answered 400 Bad Request"); err != nil {
		t.Fatal(err)
	}
	if err := b.store.FailEvent(t.Context(), evs[1].OutboxRef, "callback answered 503 Service Unavailable", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	status, body := b.client.V1(t, "POST", "/v1/events/"+evs[0].EventID+"/deliver", nil)
	if status != http.StatusAccepted || body["done"] != "released" {
		t.Errorf("deliver a held event: %d %v", status, body)
	}
	status, body = b.client.V1(t, "POST", "/v1/events/"+evs[1].EventID+"/deliver", nil)
	if status != http.StatusAccepted || body["done"] != "due_now" {
		t.Errorf("deliver a failing event: %d %v", status, body)
	}
	if held, _ := b.listAll(t, "state=held"); len(held) != 0 {
		t.Errorf("held after the release: %v", held)
	}
	again := b.claimAll(t)
	if len(again) != 2 || again[0].Attempts != 1 || again[1].Attempts != 2 {
		t.Errorf("after deliver: claimed %d (want both; the released one as its first attempt)", len(again))
	}
	status, body = b.client.V1(t, "POST", "/v1/events/no-such-event/deliver", nil)
	if msg, _ := body["error"].(string); status != http.StatusNotFound || !strings.Contains(msg, "no-such-event") {
		t.Errorf("deliver an unknown event: %d %v, want 404 naming it", status, body)
	}
}

// Pause and resume are for every worker, kept in MySQL: GET agrees with
// what they answered, and since moves only when the state changes.
func TestV1DeliveryPauseAndResume(t *testing.T) {
	b := setup(t, nil)
	state := func(method, path string) map[string]any {
		t.Helper()
		status, body := b.client.V1(t, method, path, nil)
		if status != http.StatusOK {
			t.Fatalf("%s %s: %d %v", method, path, status, body)
		}
		return body
	}
	if st := state("GET", "/v1/delivery"); st["paused"] != false || st["since"] != nil {
		t.Errorf("before any pause: %v", st)
	}
	paused := state("POST", "/v1/delivery/pause")
	if paused["paused"] != true || paused["since"] == nil {
		t.Fatalf("pause: %v", paused)
	}
	if st := state("GET", "/v1/delivery"); fmt.Sprint(st) != fmt.Sprint(paused) {
		t.Errorf("GET after the pause %v, the pause answered %v", st, paused)
	}
	if again := state("POST", "/v1/delivery/pause"); again["since"] != paused["since"] {
		t.Errorf("a second pause moved since: %v then %v", paused, again)
	}
	if _, err := b.store.ClaimDueEvents(t.Context(), 10, time.Minute); !errors.Is(err, storage.ErrDeliveryPaused) {
		t.Errorf("a claim while paused: %v", err)
	}
	if resumed := state("POST", "/v1/delivery/resume"); resumed["paused"] != false || resumed["since"] == nil {
		t.Errorf("resume: %v", resumed)
	}
	if st := state("GET", "/v1/delivery"); st["paused"] != false {
		t.Errorf("GET after the resume: %v", st)
	}
}
