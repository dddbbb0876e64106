package httpapi_test

import (
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"time"
)

// fakeOps answers the /v1 operator endpoints (docs/reference.md) with
// their documented shapes, so the page is tested before and apart from
// the storage behind them. It records the actions the page takes.
type fakeOps struct {
	key  string
	real http.Handler // the real handler: its auth decides for the fake too

	mu        sync.Mutex
	calls     []string // "DELETE /v1/steps/101", "POST /v1/events/e-7/deliver", every query seen
	steps     []map[string]any
	events    []map[string]any
	paused    bool
	pausedAt  time.Time
	delivered []string
	// collected is false while a cancelled step is still listed: the api
	// hands collection to the queue, so GET /v1/steps lists a cancelled
	// step (nothing outstanding) until a worker collects it. True drops
	// it from the listing at the DELETE, as inline collection would.
	collected bool
	cancelled map[string]bool
	// cancelFails is the error DELETE /v1/steps/{id} answers with 503,
	// by step id.
	cancelFails map[string]string
}

func newFakeOps(key string) *fakeOps {
	now := time.Now().UTC().Truncate(time.Second)
	at := func(d time.Duration) string { return now.Add(-d).Format(time.RFC3339) }
	f := &fakeOps{key: key, cancelled: map[string]bool{}, cancelFails: map[string]string{}}
	f.steps = []map[string]any{
		{"step_id": 101, "workflow_name": "io.example.inventory", "instance_id": "run-1", "step_name": "query", "created_at": at(75 * time.Hour), "not_until": nil, "timeout": at(3 * time.Hour), "ids": 12000, "outstanding_ids": 5},
		{"step_id": 102, "workflow_name": "io.example.inventory", "instance_id": "run-2", "step_name": "query", "created_at": at(26 * time.Hour), "not_until": nil, "timeout": at(-46 * time.Hour), "ids": 40, "outstanding_ids": 3},
		// scheduled: its not_until is ahead, so nothing was sent yet
		{"step_id": 104, "workflow_name": "io.example.update", "instance_id": "run-4", "step_name": "install", "created_at": at(5 * time.Hour), "not_until": at(-3 * time.Hour), "timeout": at(-75 * time.Hour), "ids": 250, "outstanding_ids": 250},
		{"step_id": 103, "workflow_name": "io.example.profile", "instance_id": "<b>bold</b>", "step_name": "install", "created_at": at(2 * time.Hour), "not_until": at(90 * time.Minute), "timeout": at(-70 * time.Hour), "ids": 1, "outstanding_ids": 1},
	}
	f.events = []map[string]any{
		{"event_id": "e-7", "type": "step.completed", "step_id": 99, "enrollment_id": "ENROLLMENT-A1", "created_at": at(5 * time.Hour), "attempts": 10, "last_error": "callback answered 400: cannot parse body", "next_attempt_at": nil, "state": "held"},
		{"event_id": "e-8", "type": "step.timed_out", "step_id": 98, "enrollment_id": "ENROLLMENT-B2", "created_at": at(4 * time.Hour), "attempts": 10, "last_error": `<img src=x onerror="document.title='owned'">`, "next_attempt_at": nil, "state": "held"},
		{"event_id": "e-gone", "type": "step.completed", "step_id": 97, "enrollment_id": "ENROLLMENT-C3", "created_at": at(3 * time.Hour), "attempts": 10, "last_error": "connection refused", "next_attempt_at": nil, "state": "held"},
		{"event_id": "e-9", "type": "step.completed", "step_id": 96, "enrollment_id": "ENROLLMENT-D4", "created_at": at(20 * time.Minute), "attempts": 3, "last_error": "Post \"https://engine.example/cb\": dial tcp 10.0.0.5:443: connect: connection refused", "next_attempt_at": now.Add(40 * time.Second).Format(time.RFC3339), "state": "failing"},
	}
	f.pausedAt = now.Add(-50 * time.Hour)
	return f
}

// outstanding is step id's outstanding enrollments, a fixed list.
func outstandingIDs(id string) []string {
	var ids []string
	for i := range 5 {
		ids = append(ids, "ENROLLMENT-"+id+"-"+strconv.Itoa(i+1))
	}
	return ids
}

// wrap answers the operator paths and hands everything else, /ui/
// included, to next.
func (f *fakeOps) wrap(next http.Handler) http.Handler {
	f.real = next
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/steps", f.auth(f.listSteps))
	mux.HandleFunc("GET /v1/steps/{id}/outstanding", f.auth(f.outstanding))
	mux.HandleFunc("DELETE /v1/steps/{id}", f.auth(f.cancel))
	mux.HandleFunc("GET /v1/events", f.auth(f.listEvents))
	mux.HandleFunc("POST /v1/events/{id}/deliver", f.auth(f.deliver))
	mux.HandleFunc("GET /v1/delivery", f.auth(f.delivery))
	mux.HandleFunc("POST /v1/delivery/{action}", f.auth(f.delivery))
	mux.Handle("/", next)
	return mux
}

// auth puts the fake behind the real handler's own check of the key (and
// of cross-site requests): the same request, to a path that answers 404
// once past it. So the test proves the page's own calls carry the key.
func (f *fakeOps) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		probe := r.Clone(r.Context())
		probe.URL.Path, probe.URL.RawQuery, probe.RequestURI, probe.Body = "/v1/ui-test-auth-probe", "", "", http.NoBody
		rec := httptest.NewRecorder()
		f.real.ServeHTTP(rec, probe)
		if rec.Code != http.StatusNotFound {
			maps.Copy(w.Header(), rec.Header())
			w.WriteHeader(rec.Code)
			w.Write(rec.Body.Bytes())
			return
		}
		f.mu.Lock()
		f.calls = append(f.calls, r.Method+" "+r.URL.RequestURI())
		f.mu.Unlock()
		h(w, r)
	}
}

func fakeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

func (f *fakeOps) listSteps(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.steps
	if v := r.URL.Query().Get("older_than"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			fakeJSON(w, http.StatusBadRequest, map[string]any{"error": "older_than: " + err.Error()})
			return
		}
		out = nil
		for _, s := range f.steps {
			if t, _ := time.Parse(time.RFC3339, s["created_at"].(string)); time.Since(t) > d {
				out = append(out, s)
			}
		}
	}
	fakeJSON(w, http.StatusOK, map[string]any{"steps": out, "next": ""})
}

func (f *fakeOps) outstanding(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	ids := outstandingIDs(id)
	// two pages: the first three, then the rest
	if r.URL.Query().Get("after") == "" {
		fakeJSON(w, http.StatusOK, map[string]any{"ids": ids[:3], "next": ids[2]})
		return
	}
	fakeJSON(w, http.StatusOK, map[string]any{"ids": ids[3:], "next": ""})
}

func (f *fakeOps) cancel(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.PathValue("id")
	if msg, ok := f.cancelFails[id]; ok {
		fakeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": msg})
		return
	}
	i := slices.IndexFunc(f.steps, func(s map[string]any) bool { return strconv.Itoa(s["step_id"].(int)) == id })
	if i < 0 || f.cancelled[id] {
		fakeJSON(w, http.StatusNotFound, map[string]any{"error": "no such step: " + id})
		return
	}
	f.cancelled[id] = true
	if f.collected {
		f.steps = slices.Delete(f.steps, i, i+1)
	} else {
		f.steps[i]["outstanding_ids"] = 0 // listed until collected
	}
	w.WriteHeader(http.StatusNoContent)
}

func (f *fakeOps) listEvents(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	state := r.URL.Query().Get("state")
	var out []map[string]any
	for _, e := range f.events {
		if state == "" || e["state"] == state {
			out = append(out, e)
		}
	}
	fakeJSON(w, http.StatusOK, map[string]any{"events": out, "next": ""})
}

func (f *fakeOps) deliver(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.PathValue("id")
	if id == "e-gone" { // delivered meanwhile by a worker
		fakeJSON(w, http.StatusNotFound, map[string]any{"error": "no such event: e-gone"})
		return
	}
	for _, e := range f.events {
		if e["event_id"] == id {
			e["state"] = "pending"
			f.delivered = append(f.delivered, id)
			fakeJSON(w, http.StatusAccepted, map[string]any{})
			return
		}
	}
	fakeJSON(w, http.StatusNotFound, map[string]any{"error": "no such event: " + id})
}

func (f *fakeOps) delivery(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.PathValue("action") {
	case "pause":
		f.paused, f.pausedAt = true, time.Now()
	case "resume":
		f.paused, f.pausedAt = false, time.Now()
	}
	fakeJSON(w, http.StatusOK, map[string]any{"paused": f.paused, "since": f.pausedAt.UTC().Format(time.RFC3339)})
}

// listed reports whether GET /v1/steps lists step id.
func (f *fakeOps) listed(id int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.steps, func(s map[string]any) bool { return s["step_id"] == id })
}

// callsSince is the calls made after the first one equal to call.
func (f *fakeOps) callsSince(call string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i := slices.Index(f.calls, call); i >= 0 {
		return slices.Clone(f.calls[i+1:])
	}
	return nil
}

// called reports whether the page made the call ("DELETE /v1/steps/101").
func (f *fakeOps) called(call string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.calls, call)
}
