package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

// serve is a second handler on b's storage, with cfg changed by mod.
func serve(t *testing.T, b *bundle, mod func(*httpapi.Config)) *testkit.Client {
	t.Helper()
	cfg := httpapi.Config{Store: b.store, Logger: zerolog.New(zerolog.NewTestWriter(t)), APIKey: apiKey, Metrics: b.m.API}
	mod(&cfg)
	srv := httptest.NewServer(httpapi.New(cfg))
	t.Cleanup(srv.Close)
	return testkit.NewClient(srv.URL, apiKey)
}

// wantError checks an error answer: its status and that its one line
// names what it should.
func wantError(t *testing.T, what string, status int, body map[string]any, wantStatus int, names string) {
	t.Helper()
	msg, _ := body["error"].(string)
	if status != wantStatus || !strings.Contains(msg, names) || strings.Contains(msg, "\n") {
		t.Errorf("%s: %d %q, want %d naming %q", what, status, msg, wantStatus, names)
	}
}

func TestListStepsPagesOldestFirstWithCountsAndFilters(t *testing.T) {
	b := setup(t, nil)
	first := b.enqueue(t, "wf.a", []string{"E1", "E2", "E3"}, "U-A")
	b.enqueue(t, "wf.b", []string{"E1"}, "U-B")
	third := b.enqueue(t, "wf.a", []string{"E4"}, "U-C")
	if err := sendResult(b.sender(nil), "E2", "U-A", "Acknowledged"); err != nil {
		t.Fatal(err)
	}

	var got []map[string]any
	path := "/v1/steps?limit=2"
	for pages := 1; ; pages++ {
		status, body := b.client.V1(t, "GET", path, nil)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %v", path, status, body)
		}
		for _, s := range body["steps"].([]any) {
			got = append(got, s.(map[string]any))
		}
		next, _ := body["next"].(string)
		if next == "" {
			if pages != 2 {
				t.Errorf("%d pages of 2 for 3 steps, want 2", pages)
			}
			break
		}
		path = "/v1/steps?limit=2&after=" + url.QueryEscape(next)
	}
	if len(got) != 3 || got[0]["step_id"] != float64(first) || got[2]["step_id"] != float64(third) {
		t.Fatalf("listed %v, want steps %d..%d oldest first", got, first, third)
	}
	s := got[0]
	for _, k := range []string{"step_id", "workflow_name", "instance_id", "step_name", "created_at", "not_until", "timeout", "ids", "outstanding_ids"} {
		if _, ok := s[k]; !ok {
			t.Errorf("step has no %q: %v", k, s)
		}
	}
	if s["ids"] != float64(3) || s["outstanding_ids"] != float64(2) || s["workflow_name"] != "wf.a" {
		t.Errorf("first step %v, want wf.a with ids 3, outstanding_ids 2", s)
	}

	status, body := b.client.V1(t, "GET", "/v1/steps?workflow_name=wf.a&instance_id=wf.a-1", nil)
	if status != http.StatusOK || len(body["steps"].([]any)) != 2 || body["next"] != nil {
		t.Errorf("wf.a: %d %v, want its 2 steps and no next", status, body)
	}
	status, body = b.client.V1(t, "GET", "/v1/steps?older_than=1h", nil)
	if status != http.StatusOK || len(body["steps"].([]any)) != 0 {
		t.Errorf("older_than=1h: %d %v, want an empty list", status, body)
	}
}

// A steps row without a creation time (written by hand, or by a tool
// that set the column to NULL) is listed and read like any other, its
// created_at null, instead of failing the whole list as "storage
// unavailable"; paging takes those first, by id, then the rest, each
// once.
func TestStepsWithoutACreationTimeAreListedAndPagedOnce(t *testing.T) {
	b := setup(t, nil)
	var ids []int64
	for i := range 5 {
		ids = append(ids, b.enqueue(t, "wf.null", []string{fmt.Sprintf("E%d", i)}, fmt.Sprintf("U-%d", i)))
	}
	b.db.Exec(`UPDATE steps SET created_at = NULL WHERE id IN (?, ?)`, ids[1], ids[3])

	var order []int64
	path := "/v1/steps?limit=1"
	for range 10 {
		status, body := b.client.V1(t, "GET", path, nil)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %v", path, status, body)
		}
		for _, v := range body["steps"].([]any) {
			st := v.(map[string]any)
			id := int64(st["step_id"].(float64))
			order = append(order, id)
			if nullTime := id == ids[1] || id == ids[3]; nullTime != (st["created_at"] == nil) {
				t.Errorf("step %d: created_at %v", id, st["created_at"])
			}
		}
		next, _ := body["next"].(string)
		if next == "" {
			break
		}
		path = "/v1/steps?limit=1&after=" + url.QueryEscape(next)
	}
	if want := []int64{ids[1], ids[3], ids[0], ids[2], ids[4]}; fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("listed %v one a page, want %v (those without a creation time first)", order, want)
	}
	status, body := b.client.V1(t, "GET", fmt.Sprintf("/v1/steps/%d", ids[1]), nil)
	if v, ok := body["created_at"]; status != http.StatusOK || !ok || v != nil || body["outstanding_ids"] != float64(1) {
		t.Errorf("GET /v1/steps/%d: %d %v, want 200 with created_at null", ids[1], status, body)
	}
}

func TestOperatorEndpointsRefuseBadInputNamingTheField(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "wf.bad", []string{"E1"}, "U-1")
	for _, c := range []struct{ method, path, names string }{
		{"GET", "/v1/steps?limit=1001", "limit"},
		{"GET", "/v1/steps?limit=0", "limit"},
		{"GET", "/v1/steps?limit=ten", "limit"},
		{"GET", "/v1/steps?older_than=3days", "older_than"},
		{"GET", "/v1/steps?older_than=-1h", "older_than"},
		{"GET", "/v1/steps?after=not-a-cursor!", "after"},
		{"GET", "/v1/steps?after=" + "c3h4eQ", "after"}, // base64url of "sxxy"
		{"GET", fmt.Sprintf("/v1/steps/%d/outstanding?limit=100000", id), "limit"},
		{"GET", fmt.Sprintf("/v1/steps/%d/outstanding?after=%%25%%25", id), "after"},
		{"GET", fmt.Sprintf("/v1/steps/%d/outstanding?after=%%%%%%", id), "query: invalid URL escape"}, // not read as no cursor
		{"GET", "/v1/steps?limit=%zz", "query: invalid URL escape"},
		{"GET", "/v1/steps/x/outstanding", "step_id"},
		{"DELETE", "/v1/steps/0", "step_id"},
		{"DELETE", "/v1/steps/-3", "step_id"},
		{"DELETE", "/v1/steps", "workflow_name"},
		{"DELETE", "/v1/steps?workflow_name=wf.bad", "instance_id"},
		{"DELETE", "/v1/steps?instance_id=wf.bad-1", "workflow_name"},
		// each parameter at most once, and none the endpoint does not take:
		// a misspelt filter on a cancel would cancel everything
		{"GET", "/v1/steps?workflow_name=wf.bad&workflow_name=wf.other", "workflow_name: given 2 times"},
		{"GET", "/v1/steps?workflow=wf.bad", "workflow: not a parameter of GET /v1/steps (it takes workflow_name, instance_id, older_than, limit and after)"},
		{"GET", fmt.Sprintf("/v1/steps/%d/outstanding?limit=1&limit=2", id), "limit: given 2 times"},
		{"GET", fmt.Sprintf("/v1/steps/%d/outstanding?state=held", id), "state: not a parameter of GET /v1/steps/{step_id}/outstanding"},
		{"GET", "/v1/events?state=held&state=failing", "state: given 2 times"},
		{"GET", "/v1/events?status=held", "status: not a parameter of GET /v1/events (it takes state, limit and after)"},
		{"DELETE", "/v1/enrollments/E1/steps?workflow=wf.bad", "workflow: not a parameter of DELETE /v1/enrollments/{id}/steps (it takes workflow_name)"},
		{"DELETE", "/v1/enrollments/E1/steps?workflow_name=wf.bad&workflow_name=wf.other", "workflow_name: given 2 times"},
		{"DELETE", "/v1/steps?workflow_name=wf.bad&instance_id=wf.bad-1&instance_id=x", "instance_id: given 2 times"},
		{"DELETE", "/v1/steps?workflow_name=wf.bad&instance=wf.bad-1", "instance: not a parameter"},
	} {
		status, body := b.client.V1(t, c.method, c.path, nil)
		wantError(t, c.method+" "+c.path, status, body, http.StatusBadRequest, c.names)
	}
	// none of the refused cancels cancelled anything
	if status, body := b.client.V1(t, "GET", fmt.Sprintf("/v1/steps/%d", id), nil); status != http.StatusOK || body["outstanding_ids"] != float64(1) {
		t.Errorf("the step after the refused cancels: %d %v, want it outstanding for E1", status, body)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", fmt.Sprintf("/v1/steps/%d/outstanding", id+100)},
		{"DELETE", fmt.Sprintf("/v1/steps/%d", id+100)},
	} {
		status, body := b.client.V1(t, c.method, c.path, nil)
		wantError(t, c.method+" "+c.path, status, body, http.StatusNotFound, fmt.Sprint(id+100))
	}
	noKey := testkit.NewClient(b.srv.URL, "wrong")
	for _, p := range []string{"/v1/steps", fmt.Sprintf("/v1/steps/%d/outstanding", id)} {
		if status, _ := noKey.V1(t, "GET", p, nil); status != http.StatusUnauthorized {
			t.Errorf("GET %s with a wrong key: %d, want 401", p, status)
		}
	}
	if status, _ := noKey.V1(t, "DELETE", fmt.Sprintf("/v1/steps/%d", id), nil); status != http.StatusUnauthorized {
		t.Errorf("DELETE with a wrong key: %d, want 401", status)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands`); n != 1 {
		t.Errorf("refused requests changed id_commands: %d rows, want 1", n)
	}
}

func TestStepOutstandingListsTheEnrollmentsNotDoneInPages(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "wf.out", []string{"E1", "E2", "E3", "E4", "E5"}, "U-1", "U-2")
	w := b.sender(nil)
	for _, u := range []string{"U-1", "U-2"} { // E3 done
		if err := sendResult(w, "E3", u, "Acknowledged"); err != nil {
			t.Fatal(err)
		}
	}
	if err := sendResult(w, "E4", "U-1", "Acknowledged"); err != nil { // half done: outstanding
		t.Fatal(err)
	}
	var got []string
	path := fmt.Sprintf("/v1/steps/%d/outstanding?limit=3", id)
	for {
		status, body := b.client.V1(t, "GET", path, nil)
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %v", path, status, body)
		}
		for _, e := range body["ids"].([]any) {
			got = append(got, e.(string))
		}
		next, _ := body["next"].(string)
		if next == "" {
			break
		}
		path = fmt.Sprintf("/v1/steps/%d/outstanding?limit=3&after=%s", id, url.QueryEscape(next))
	}
	if strings.Join(got, ",") != "E1,E2,E4,E5" {
		t.Errorf("outstanding %v, want E1,E2,E4,E5", got)
	}
}

// DELETE /v1/steps/{id} cancels every enrollment (no event), the step is
// collected, a second DELETE is 404, and a result that comes afterwards is
// answered 200 and counted as for a command no step holds.
func TestCancelStepForEveryEnrollmentThenNotFound(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "wf.cancel", []string{"E1", "E2", "E3"}, "U-1", "U-2")
	keep := b.enqueue(t, "wf.keep", []string{"E1"}, "U-K")
	if err := sendResult(b.sender(nil), "E2", "U-1", "Acknowledged"); err != nil {
		t.Fatal(err)
	}
	if status, body := b.client.V1(t, "DELETE", fmt.Sprintf("/v1/steps/%d", id), nil); status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %v, want 204", status, body)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps WHERE id = ?`, id); n != 0 {
		t.Errorf("cancelled step not collected")
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE step_id = ?`, keep); n != 1 {
		t.Errorf("the other step has %d rows, want 1", n)
	}
	if n := testkit.OutboxRows(t, b.db.DB); n != 0 {
		t.Errorf("a cancel wrote %d events, want none", n)
	}
	status, body := b.client.V1(t, "DELETE", fmt.Sprintf("/v1/steps/%d", id), nil)
	wantError(t, "second DELETE", status, body, http.StatusNotFound, fmt.Sprint(id))
	if err := sendResult(b.sender(nil), "E1", "U-1", "Acknowledged"); err != nil {
		t.Errorf("a result after the cancel: %v, want 200", err)
	}
	if got := testutil.ToFloat64(b.m.API.UnknownCommandResults); got != 1 {
		t.Errorf("stepcollect_unknown_command_results_total = %v, want 1", got)
	}
}

func TestCancelWorkflowInstanceCountsItsSteps(t *testing.T) {
	b := setup(t, nil)
	b.enqueue(t, "wf.inst", []string{"E1", "E2"}, "U-1")
	b.enqueue(t, "wf.inst", []string{"E3"}, "U-2")
	other := b.enqueue(t, "wf.other", []string{"E1"}, "U-3")
	status, body := b.client.V1(t, "DELETE", "/v1/steps?workflow_name=wf.inst&instance_id=wf.inst-1", nil)
	if status != http.StatusOK || body["cancelled_steps"] != float64(2) {
		t.Fatalf("DELETE instance: %d %v, want 200 with cancelled_steps 2", status, body)
	}
	if got := testkit.CountStepRows(t, b.db.DB); got.Steps != 1 || got.IDCommands != 1 {
		t.Errorf("left %+v, want step %d alone", got, other)
	}
	status, body = b.client.V1(t, "DELETE", "/v1/steps?workflow_name=wf.inst&instance_id=wf.inst-1", nil)
	if status != http.StatusOK || body["cancelled_steps"] != float64(0) {
		t.Errorf("again: %d %v, want 200 with cancelled_steps 0", status, body)
	}
}

func TestVersionAnswersWithoutKey(t *testing.T) {
	b := setup(t, nil)
	resp, err := http.Get(b.srv.URL + "/version")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw bytes.Buffer
	raw.ReadFrom(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /version: %d %s", resp.StatusCode, raw.Bytes())
	}
	if !bytes.Contains(raw.Bytes(), []byte(`"version":`)) || !bytes.Contains(raw.Bytes(), []byte(`"commit":`)) {
		t.Errorf("GET /version: %s, want version and commit", raw.Bytes())
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// completions wraps the storage and records, per enrollment, how many of
// its result calls returned a completed step.
type completions struct {
	httpapi.Store
	mu   sync.Mutex
	by   map[string]int
	seen atomic.Int64
}

func (c *completions) StoreCommandResponseAndRetrieveCompletedStep(ctx context.Context, id string, sc *nanostorage.StepCommandResult) (*nanostorage.StepResult, error) {
	res, err := c.Store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, sc)
	c.seen.Add(1)
	if err == nil && res != nil {
		c.mu.Lock()
		c.by[id]++
		c.mu.Unlock()
	}
	return res, err
}

// The cancel of a step sent to 10,000 enrollments (two commands each)
// while 2,000 results for it arrive from 16 clients through the real
// handler: every result is answered 200, nothing is left half done (no
// id_commands row, the step collected), and the step.completed events are
// exactly the completions the storage returned, at most one per enrollment,
// each with both results.
func TestCancelOfTenThousandEnrollmentStepWhileResultsArrive(t *testing.T) {
	if testing.Short() {
		t.Skip("10,000 enrollments")
	}
	b := setup(t, nil)
	if b.db.Stats().MaxOpenConnections < 32 {
		t.Fatalf("pool of %d, want at least 32", b.db.Stats().MaxOpenConnections)
	}
	rec := &completions{Store: b.store, by: map[string]int{}}
	c := serve(t, b, func(cfg *httpapi.Config) { cfg.Store = rec; cfg.Logger = zerolog.Nop() })
	const n, answering, clients = 10_000, 1_000, 16
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("E-%05d", i)
	}
	id := b.enqueue(t, "wf.big", ids, "U-1", "U-2")

	// enrollments spread over the whole step, so that results meet every
	// cancel transaction: every 10th, both commands each
	type result struct{ id, uuid string }
	// in random order, so that some come after the cancel passed them
	work := make(chan result, 2*answering)
	for _, k := range rand.Perm(2 * answering) {
		work <- result{ids[k/2*(n/answering)], []string{"U-1", "U-2"}[k%2]}
	}
	close(work)
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	start := make(chan struct{})
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for r := range work {
				status, raw, err := c.Webhook(testkit.Acknowledged(r.id, r.uuid))
				if err != nil || status != http.StatusOK {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%s %s: %d %s %v", r.id, r.uuid, status, raw, err))
				}
			}
		}()
	}
	close(start)
	// the cancel starts once results are flowing
	testkit.WaitUntil(t, 15*time.Second, "results arriving", func() (bool, any) { return rec.seen.Load() >= 50, rec.seen.Load() })
	began := time.Now()
	status, body := c.V1(t, "DELETE", fmt.Sprintf("/v1/steps/%d", id), nil)
	if status != http.StatusNoContent {
		t.Errorf("DELETE: %d %v, want 204", status, body)
	}
	took, during := time.Since(began), rec.seen.Load()
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Errorf("%d results not answered 200; first: %v", f, firstErr.Load())
	}

	if rows := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands`); rows != 0 {
		t.Errorf("%d id_commands rows left", rows)
	}
	testkit.WaitUntil(t, 15*time.Second, "the step collected", func() (bool, any) {
		s := testkit.CountStepRows(t, b.db.DB)
		return s.Steps == 0, s
	})
	completed := 0
	for e, k := range rec.by {
		completed += k
		if k > 1 {
			t.Errorf("%s completed %d times", e, k)
		}
	}
	events := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE event_type = ?`, events.StepCompleted)
	twice := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM (SELECT enrollment_id FROM stepcollect_outbox GROUP BY enrollment_id HAVING COUNT(*) > 1) x`)
	all := testkit.OutboxRows(t, b.db.DB)
	if events != completed || all != events || twice != 0 {
		t.Errorf("%d step.completed events (%d in all, %d enrollments twice) for %d completions returned", events, all, twice, completed)
	}
	// each event is an enrollment the storage said completed, with both results
	rows, err := b.db.Query(`SELECT enrollment_id, payload FROM stepcollect_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var e string
		var payload []byte
		if err := rows.Scan(&e, &payload); err != nil {
			t.Fatal(err)
		}
		if rec.by[e] != 1 || bytes.Count(payload, []byte(`"completed":true`)) != 2 {
			t.Errorf("event for %s (completions returned: %d) has %d completed commands, want 2", e, rec.by[e], bytes.Count(payload, []byte(`"completed":true`)))
		}
	}
	t.Logf("cancel took %v, %d results in by its end; %d of %d answering enrollments completed before their cancel; %d results for cancelled commands",
		took, during, completed, answering, int(testutil.ToFloat64(b.m.API.UnknownCommandResults)))
}
