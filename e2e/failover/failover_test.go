// Package failover drives the built binaries through the failovers of a
// deployment that has outgrown one machine, while webhook results arrive:
//
//   - Redis behind Sentinel (a primary, a replica, three Sentinels, all
//     real processes): the primary SIGKILLed in the middle of a fan-out,
//     then, once it is back as a replica, a failover back to it asked of
//     Sentinel (sentinel_test.go);
//   - MySQL refusing writes for a while (GLOBAL read_only on a private
//     mariadbd, as a managed service does to the old primary while it
//     fails over) (readonly_test.go).
//
// Each round enqueues a step of its own to each of N enrollments (default
// 300, STEPCOLLECT_FAILOVER_N) and one step shared by all of them, then
// sends the 2N results at an even pace while the fault happens. Every
// flag but addresses, DSN, Redis URL and callback URL is at its default
// (-sweep-interval 30s), and the bound is guarantee 8 of CONTRACT.md:
// within 15 s of the fault's end every step is collected and every event
// delivered. The tests log what they measured, each on a line starting
// with FAILOVER.
package failover

import (
	"bytes"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/scrape"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

var bins map[string]string

// TestMain builds the binaries without the race detector (the bounds are
// about the service's own timing), or uses those in
// STEPCOLLECT_FAILOVER_BINDIR.
func TestMain(m *testing.M) {
	testkit.Main(m, "STEPCOLLECT_FAILOVER_BINDIR", false, func(b map[string]string) { bins = b }, "cmd/api", "cmd/worker")
}

const (
	apiKey = "failover-api-key"
	// bound is guarantee 8: from the end of a fault to every step
	// collected and every event delivered.
	bound = 15 * time.Second
	// overtime is how much longer a round that missed the bound keeps
	// watching, to report how late it was (two sweep intervals).
	overtime = 60 * time.Second
)

func enrollments() int {
	if v, err := strconv.Atoi(os.Getenv("STEPCOLLECT_FAILOVER_N")); err == nil && v > 0 {
		return v
	}
	return 300
}

// ---------------------------------------------------------------------------
// the workflow engine's receiver

// receiver is the workflow engine's callback endpoint: it deduplicates on
// event_id, records when each event first arrived and which step and
// enrollment it completes, and checks that one completion always comes
// under one event id.
type receiver struct {
	mu     sync.Mutex
	first  map[string]time.Time // event_id → first arrival
	byPair map[string]string    // "step_id/enrollment" → event_id
	posts  int
	dups   int
	wrong  []string
}

func newReceiver() *receiver {
	return &receiver{first: map[string]time.Time{}, byPair: map[string]string{}}
}

func pairKey(stepID int64, enrollment string) string { return fmt.Sprintf("%d/%s", stepID, enrollment) }

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 4<<20))
	now := time.Now()
	var ev struct {
		EventID string `json:"event_id"`
		Type    string `json:"type"`
		Step    struct {
			StepID int64    `json:"step_id"`
			IDs    []string `json:"ids"`
		} `json:"step"`
	}
	if err == nil {
		err = json.Unmarshal(body, &ev)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.posts++
	if err != nil || ev.EventID == "" {
		r.wrong = append(r.wrong, fmt.Sprintf("unreadable event (%v): %.200s", err, body))
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if ev.Type != "step.completed" || len(ev.Step.IDs) != 1 {
		r.wrong = append(r.wrong, fmt.Sprintf("event %s: type %q with ids %v, want one enrollment's step.completed", ev.EventID, ev.Type, ev.Step.IDs))
	} else {
		pair := pairKey(ev.Step.StepID, ev.Step.IDs[0])
		if prev, ok := r.byPair[pair]; ok && prev != ev.EventID {
			r.wrong = append(r.wrong, fmt.Sprintf("step/enrollment %s delivered under event ids %s and %s", pair, prev, ev.EventID))
		}
		r.byPair[pair] = ev.EventID
	}
	if _, ok := r.first[ev.EventID]; ok {
		r.dups++
	} else {
		r.first[ev.EventID] = now
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.first)
}

// last is when the latest distinct event first arrived.
func (r *receiver) last() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var last time.Time
	for _, at := range r.first {
		if at.After(last) {
			last = at
		}
	}
	return last
}

// has reports whether the completion of step by enrollment was delivered.
func (r *receiver) has(stepID int64, enrollment string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.byPair[pairKey(stepID, enrollment)]
	return ok
}

func (r *receiver) counts() (distinct, pairs, posts, dups int, wrong []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.first), len(r.byPair), r.posts, r.dups, append([]string(nil), r.wrong...)
}

// ---------------------------------------------------------------------------
// the stack

// stack is one api and one worker at default flags.
type stack struct {
	db         *sql.DB // the test's own view of the database
	rcv        *receiver
	apiURL     string
	workerAddr string
	api        *testkit.Proc
	worker     *testkit.Proc
	client     *http.Client
	wantEvents int // every round's so far

	mu    sync.Mutex
	steps map[int64]string // step id → what it is, for reports
}

func startStack(t *testing.T, dsn, redisURL string, db *sql.DB) *stack {
	t.Helper()
	s := &stack{db: db, rcv: newReceiver(), steps: map[int64]string{}}
	cb := httptest.NewServer(s.rcv)
	t.Cleanup(cb.Close)
	// nothing else: every other flag at its default
	env := []string{"STEPCOLLECT_MYSQL_DSN=" + dsn, "STEPCOLLECT_REDIS_URL=" + redisURL}
	s.workerAddr = testkit.FreeAddr(t)
	s.worker = testkit.StartProc(t, bins["worker"], env, "-metrics-listen", s.workerAddr, "-callback-url", cb.URL)
	testkit.AwaitHTTP(t, s.worker, "http://"+s.workerAddr+"/readyz", 30*time.Second)
	apiAddr := testkit.FreeAddr(t)
	s.api = testkit.StartProc(t, bins["api"], append(env, "STEPCOLLECT_API_KEY="+apiKey), "-listen", apiAddr)
	s.apiURL = "http://" + apiAddr
	testkit.AwaitHTTP(t, s.api, s.apiURL+"/readyz", 30*time.Second)
	// NanoMDM's webhook client gives up after 30 s (and does not resend)
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	return s
}

func (s *stack) post(path string, body []byte, header map[string]string) (int, []byte, error) {
	req, _ := http.NewRequest("POST", s.apiURL+path, bytes.NewReader(body))
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, nil
}

// stillRunning fails t unless the api and the worker are the processes
// started at first: a failover must be followed, not survived by restart.
func (s *stack) stillRunning(t *testing.T) {
	t.Helper()
	for name, p := range map[string]*testkit.Proc{"api": s.api, "worker": s.worker} {
		if p.Cmd.ProcessState != nil {
			t.Errorf("%s (pid %d) exited: %v", name, p.PID(), p.Cmd.ProcessState)
		}
	}
}

// stop stops both with SIGTERM; each must exit cleanly.
func (s *stack) stop(t *testing.T) {
	t.Helper()
	if err := s.api.Stop(); err != nil {
		t.Errorf("api on SIGTERM: %v", err)
	}
	if err := s.worker.Stop(); err != nil {
		t.Errorf("worker on SIGTERM: %v", err)
	}
}

func forEach(n, width int, f func(i int)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, width)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			f(i)
		}()
	}
	wg.Wait()
}

// round is one fan-out: a step of its own to each of n enrollments and one
// step shared by all of them, with prefix in every name.
type round struct {
	prefix     string
	n          int
	own        []int64 // enrollment i's own step
	sharedStep int64
}

func (r *round) id(i int) string      { return fmt.Sprintf("%s-E%04d", r.prefix, i) }
func (r *round) ownUUID(i int) string { return fmt.Sprintf("%s-OWN-%04d", r.prefix, i) }
func (r *round) sharedUUID() string   { return r.prefix + "-SHARED" }

// enqueue makes a round's steps through /v1/steps.
func (s *stack) enqueue(t *testing.T, prefix string, n int) *round {
	t.Helper()
	r := &round{prefix: prefix, n: n, own: make([]int64, n)}
	auth := map[string]string{"Authorization": "Bearer " + apiKey}
	mk := func(instance string, ids []string, uuid, what string) (int64, error) {
		body, _ := json.Marshal(map[string]any{"workflow_name": "io.example.failover", "instance_id": instance, "step_name": "query",
			"ids": ids, "commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation"}}})
		status, b, err := s.post("/v1/steps", body, auth)
		if err != nil || status != http.StatusCreated {
			return 0, fmt.Errorf("enqueue %s: %d %s %v", what, status, b, err)
		}
		var out struct {
			StepID int64 `json:"step_id"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return 0, fmt.Errorf("enqueue %s: %s: %v", what, b, err)
		}
		s.mu.Lock()
		s.steps[out.StepID] = what
		s.mu.Unlock()
		return out.StepID, nil
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = r.id(i)
	}
	var err error
	if r.sharedStep, err = mk(prefix+"-shared", ids, r.sharedUUID(), prefix+": the shared step"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var errs []error
	forEach(n, 8, func(i int) {
		id, err := mk(r.ownUUID(i), []string{r.id(i)}, r.ownUUID(i), prefix+": the own step of "+r.id(i))
		mu.Lock()
		defer mu.Unlock()
		r.own[i] = id
		if err != nil {
			errs = append(errs, err)
		}
	})
	if len(errs) > 0 {
		t.Fatalf("%d enqueues failed, first: %v", len(errs), errs[0])
	}
	s.wantEvents += 2 * n
	return r
}

// result is one webhook body: enrollment i answering its own command or
// the shared one.
type result struct {
	r      *round
	i      int
	shared bool
}

func (x result) uuid() string {
	if x.shared {
		return x.r.sharedUUID()
	}
	return x.r.ownUUID(x.i)
}

func (x result) stepID() int64 {
	if x.shared {
		return x.r.sharedStep
	}
	return x.r.own[x.i]
}

func (x result) String() string { return x.r.id(x.i) + "/" + x.uuid() }

func (x result) body() []byte {
	id, uuid := x.r.id(x.i), x.uuid()
	raw := fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>CommandUUID</key><string>%s</string><key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string><key>QueryResponses</key><dict><key>SerialNumber</key><string>SN-%s</string></dict></dict></plist>`, uuid, id, id)
	return fmt.Appendf(nil, `{"topic":"mdm.Connect","event_id":"%s-%s","created_at":%q,"acknowledge_event":{"udid":%q,"command_uuid":%q,"raw_payload":%q}}`,
		id, uuid, time.Now().UTC().Format(time.RFC3339), id, uuid, base64.StdEncoding.EncodeToString(raw))
}

// results is every result of r: each enrollment answers its own command,
// then the shared one (the shared step is released by the last of all).
func (r *round) results() []result {
	rs := make([]result, 0, 2*r.n)
	for i := range r.n {
		rs = append(rs, result{r: r, i: i}, result{r: r, i: i, shared: true})
	}
	return rs
}

// answer is one webhook call, timed.
type answer struct {
	x          result
	start, end time.Time
	status     int
	body       string
	err        error
}

func (a answer) took() time.Duration { return a.end.Sub(a.start) }

func (s *stack) send(x result) answer {
	a := answer{x: x, start: time.Now()}
	var b []byte
	a.status, b, a.err = s.post("/webhook", x.body(), nil)
	a.end = time.Now()
	a.body = strings.TrimSpace(string(b))
	return a
}

// stream sends rs at an even pace over d (at most width at once) and
// delivers every answer on the returned channel, closing it when all are in.
func (s *stack) stream(rs []result, d time.Duration, width int) <-chan []answer {
	out := make(chan []answer, 1)
	go func() {
		var mu sync.Mutex
		answers := make([]answer, 0, len(rs))
		var wg sync.WaitGroup
		sem := make(chan struct{}, width)
		start := time.Now()
		for k, x := range rs {
			// pacing the load, not waiting for a condition
			time.Sleep(time.Until(start.Add(d * time.Duration(k) / time.Duration(len(rs)))))
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				a := s.send(x)
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}()
		}
		wg.Wait()
		out <- answers
	}()
	return out
}

// ---------------------------------------------------------------------------
// waiting and reporting

func (s *stack) counts(t *testing.T) (steps, idCommands, outbox int) {
	t.Helper()
	err := s.db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM stepcollect_outbox)`).
		Scan(&steps, &idCommands, &outbox)
	if err != nil {
		t.Fatal(err)
	}
	return steps, idCommands, outbox
}

// watch polls cond every 20 ms until it holds or until gives up; it
// reports when it first held.
func watch(until time.Time, cond func() bool) (time.Time, bool) {
	for {
		if cond() {
			return time.Now(), true
		}
		if time.Now().After(until) {
			return time.Time{}, false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// settled is what awaitSettled saw, relative to from.
type settled struct {
	collected, delivered, drained time.Duration
}

func (st settled) String() string {
	return fmt.Sprintf("steps collected %v, events delivered %v, outbox empty %v",
		st.collected.Round(time.Millisecond), st.delivered.Round(time.Millisecond), st.drained.Round(time.Millisecond))
}

// awaitSettled waits until every step is collected, every event delivered
// and the outbox empty, noting when each first held, and fails t for
// whichever did not within bound of from (then watching up to overtime
// more, to say how late).
func (s *stack) awaitSettled(t *testing.T, from time.Time, what string) settled {
	t.Helper()
	var collectedAt, deliveredAt, drainedAt time.Time
	check := func() bool {
		now := time.Now()
		steps, _, outbox := s.counts(t)
		if collectedAt.IsZero() && steps == 0 {
			collectedAt = now
		}
		if deliveredAt.IsZero() && s.rcv.distinct() >= s.wantEvents {
			deliveredAt = s.rcv.last()
		}
		if drainedAt.IsZero() && outbox == 0 && !deliveredAt.IsZero() {
			drainedAt = now
		}
		return !collectedAt.IsZero() && !deliveredAt.IsZero() && !drainedAt.IsZero()
	}
	if _, ok := watch(from.Add(bound), check); !ok {
		s.explain(t, from)
		watch(from.Add(bound+overtime), check)
		for _, c := range []struct {
			name string
			at   time.Time
		}{{"steps collected", collectedAt}, {"events delivered", deliveredAt}, {"outbox empty", drainedAt}} {
			switch {
			case c.at.IsZero():
				t.Errorf("%s: %s: not within %v, still not after %v more", what, c.name, bound, overtime)
			case c.at.Sub(from) > bound:
				t.Errorf("%s: %s: not within %v; done after %v (%v late)", what, c.name, bound,
					c.at.Sub(from).Round(time.Millisecond), (c.at.Sub(from) - bound).Round(time.Millisecond))
			}
		}
		if !deliveredAt.IsZero() || s.rcv.distinct() < s.wantEvents {
			t.Logf("%s: %d of %d events delivered", what, s.rcv.distinct(), s.wantEvents)
		}
	}
	since := func(at time.Time) time.Duration {
		if at.IsZero() {
			return -1
		}
		return at.Sub(from)
	}
	return settled{collected: since(collectedAt), delivered: since(deliveredAt), drained: since(drainedAt)}
}

// explain logs what is left and the worker's counters.
func (s *stack) explain(t *testing.T, from time.Time) {
	steps, idc, ob := s.counts(t)
	distinct, pairs, posts, dups, _ := s.rcv.counts()
	t.Logf("at the deadline (%v after the fault's end): %d steps, %d id_commands rows, %d outbox rows left; %d of %d events delivered (%d pairs, %d POSTs, %d redelivered)",
		time.Since(from).Round(time.Millisecond), steps, idc, ob, distinct, s.wantEvents, pairs, posts, dups)
	rows, err := s.db.Query(`SELECT s.id, (SELECT COUNT(*) FROM id_commands c WHERE c.step_id = s.id) FROM steps s ORDER BY s.id LIMIT 20`)
	if err == nil {
		unreferenced := 0
		for rows.Next() {
			var id int64
			var refs int
			rows.Scan(&id, &refs)
			s.mu.Lock()
			what := s.steps[id]
			s.mu.Unlock()
			t.Logf("  step %d (%s) left, %d id_commands rows refer to it", id, what, refs)
			if refs == 0 {
				unreferenced++
			}
		}
		rows.Close()
		if unreferenced > 0 {
			t.Logf("  %d of those are unreferenced, released by a committed result, and their collect task never ran: "+
				"a queue write lost (during a Redis failover: acknowledged by the old primary, gone with it); only the next sweep finds them", unreferenced)
		}
	}
	s.logMetrics(t)
}

// logMetrics logs the counters that say how the hand-off and the worker
// fared.
func (s *stack) logMetrics(t *testing.T) {
	t.Helper()
	if fams, err := scrape.Families(s.apiURL + "/metrics"); err == nil {
		t.Logf("  api metrics: results completed_step %.0f error %.0f; enqueue_failures %.0f; handoff_dropped_steps %.0f",
			scrape.Value(fams, "stepcollect_results_total", "outcome", "completed_step"),
			scrape.Value(fams, "stepcollect_results_total", "outcome", "error"),
			scrape.Value(fams, "stepcollect_enqueue_failures_total"),
			scrape.Value(fams, "stepcollect_handoff_dropped_steps_total"))
	} else {
		t.Logf("  api metrics: %v", err)
	}
	if fams, err := scrape.Families("http://" + s.workerAddr + "/metrics"); err == nil {
		t.Logf("  worker metrics: steps_collected %.0f; collect_runs collected %.0f referenced %.0f gone %.0f error %.0f; deliveries ok %.0f; tx_retries %.0f",
			scrape.Value(fams, "stepcollect_steps_collected_total"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "collected"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "referenced"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "gone"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "error"),
			scrape.Value(fams, "stepcollect_deliveries_total", "outcome", "ok"),
			scrape.Value(fams, "stepcollect_tx_retries_total"))
	} else {
		t.Logf("  worker metrics: %v", err)
	}
}

// checkReceiver fails t for anything the receiver saw wrong, or for
// completions delivered other than once per step and enrollment.
func (s *stack) checkReceiver(t *testing.T) {
	t.Helper()
	distinct, pairs, _, _, wrong := s.rcv.counts()
	if distinct != s.wantEvents || pairs != s.wantEvents {
		t.Errorf("receiver: %d distinct event ids for %d step/enrollment completions, want %d of each", distinct, pairs, s.wantEvents)
	}
	for _, w := range wrong {
		t.Errorf("receiver: %s", w)
	}
}

// logDigest summarises what the binaries logged at warn and above since
// since, one line per kind of message, with how often and when (relative
// to from).
func (s *stack) logDigest(t *testing.T, since, from time.Time) {
	t.Helper()
	type group struct {
		n           int
		first, last time.Time
		sample      string
	}
	for _, pr := range []struct {
		name string
		p    *testkit.Proc
	}{{"api", s.api}, {"worker", s.worker}} {
		groups := map[string]*group{}
		var keys []string
		for _, line := range strings.Split(pr.p.Logs(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			str := func(k string) string { v, _ := m[k].(string); return v }
			if lv := str("level"); lv != "warn" && lv != "error" {
				continue
			}
			key := fmt.Sprintf("%s [%s] %s", str("level"), str("component"), str("message"))
			at, _ := time.Parse(time.RFC3339Nano, str("time"))
			if at.Before(since.Truncate(time.Second)) {
				continue
			}
			g := groups[key]
			if g == nil {
				g = &group{first: at, sample: str("error")}
				groups[key] = g
				keys = append(keys, key)
			}
			g.n++
			g.last = at
		}
		sort.Slice(keys, func(i, j int) bool { return groups[keys[i]].first.Before(groups[keys[j]].first) })
		var b strings.Builder
		for _, k := range keys {
			g := groups[k]
			fmt.Fprintf(&b, "\n  %s ×%d, %v … %v", k, g.n, g.first.Sub(from).Round(time.Millisecond), g.last.Sub(from).Round(time.Millisecond))
			if g.sample != "" {
				fmt.Fprintf(&b, " (%.200s)", strings.TrimSpace(g.sample))
			}
		}
		if b.Len() == 0 {
			b.WriteString(" nothing")
		}
		t.Logf("%s logged at warn and above (times from the fault):%s", pr.name, b.String())
	}
}

// percentile is the p-th percentile (0..100) of ds, 0 for none.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	k := int(float64(len(s)-1) * p / 100)
	return s[k]
}
