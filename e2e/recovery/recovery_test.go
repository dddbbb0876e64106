// Package recovery drives the built binaries through one fault at a time
// (Redis killed and restarted, a worker SIGKILLed and restarted, MySQL
// unreachable and back, the workflow engine's receiver down) while webhook
// results arrive, and holds them to guarantee 8 of CONTRACT.md: once the
// fault ends, every step is collected and every event delivered within 15 s,
// at default flags (only addresses, DSN, Redis URL, callback URL and keys
// are set; -sweep-interval stays 30s).
//
// Each test enqueues a step of its own to each of N enrollments (default
// 400, STEPCOLLECT_RECOVERY_N) and one step shared by all of them, then
// sends the 2N results at an even pace over the time before, during and
// after the fault, so results really arrive while it lasts. The fault
// begins half a second after a slot of the default 30 s sweep, so no
// periodic sweep runs between its start and the deadline: the bound holds
// at any phase of the sweeper only if it holds at this one. Each test logs
// (a line starting RECOVERY) how long after the fault ended the last step
// was collected, the last distinct event arrived and the outbox was empty;
// when the bound is missed it keeps watching (up to a minute more) to say
// how late, and logs what was left, the queue, the outbox, the worker's
// counters and a digest of the binaries' logs.
package recovery

import (
	"bytes"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"errors"
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

	"github.com/go-sql-driver/mysql"
	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/internal/scrape"
	"github.com/stepcollect/stepcollect/internal/tcpproxy"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/tasks"
)

var bins map[string]string

// TestMain builds the binaries without the race detector (the bound is
// about the service's own timing), or uses those in
// STEPCOLLECT_RECOVERY_BINDIR.
func TestMain(m *testing.M) {
	testkit.Main(m, "STEPCOLLECT_RECOVERY_BINDIR", false, func(b map[string]string) { bins = b }, "cmd/api", "cmd/worker")
}

const (
	apiKey = "recovery-api-key"
	// bound is guarantee 8: from the end of a fault to every step collected
	// and every event delivered.
	bound = 15 * time.Second
	// overtime is how much longer a test that missed the bound keeps
	// watching, to report how late the work was (two sweep intervals).
	overtime = 60 * time.Second
	// sweepInterval is the worker's default -sweep-interval. Its sweeps
	// run at multiples of it (tasks.RunSlots), the same on every replica.
	sweepInterval = 30 * time.Second
)

func enrollments() int {
	if v, err := strconv.Atoi(os.Getenv("STEPCOLLECT_RECOVERY_N")); err == nil && v > 0 {
		return v
	}
	return 400
}

// 1. Redis killed (SIGKILL, its data gone: no persistence) in the middle of
// the results and started again, empty, on the same port four seconds
// later. Every webhook answers 200 throughout; within 15 s of the restart
// every step is collected and every event delivered. The collect tasks
// Redis holds just before the kill are noted, to tell steps whose task died
// with Redis from steps the api kept and handed over again.
func TestRedisKilledAndRestarted(t *testing.T) {
	s := startStack(t, stackOptions{})
	s.run(t, fault{
		name:   "redis killed and restarted",
		before: 2 * time.Second, during: 4 * time.Second, after: 2 * time.Second,
		begin: func() {
			q, err := s.queuedSteps()
			s.mu.Lock()
			s.queuedAtFault, s.queuedErr = q, err
			s.mu.Unlock()
			s.redis.Kill()
		},
		end: func() { s.redis.Restart() },
	})
}

// 2. The worker SIGKILLed while results arrive and a new one started on the
// same flags three seconds later. Within 15 s of the restart every step is
// collected and every event delivered; events the dead worker had claimed
// may be delivered again, but only under their own event ids. The receiver
// takes 200 ms an event, so the kill finds POSTs in flight and their
// claims leased to the dead worker.
func TestWorkerKilledAndRestarted(t *testing.T) {
	s := startStack(t, stackOptions{receiverDelay: 200 * time.Millisecond})
	s.run(t, fault{
		name:   "worker SIGKILLed and restarted",
		before: 2 * time.Second, during: 3 * time.Second, after: 2 * time.Second,
		begin: func() { s.worker().Kill() },
		end:   func() { s.startWorker(t) },
	})
}

// 3. MySQL unreachable from both binaries (every connection through the
// proxy closed, new ones refused) for five seconds in the middle of the
// results, then reachable again. Webhooks answer 503 meanwhile; the test
// sends those results again once the stream is over (NanoMDM would not, but
// every enrollment must end up done). Within 15 s of the restore every step
// is collected and every event delivered. The shared server itself is never
// touched.
func TestMySQLUnreachableAndBack(t *testing.T) {
	s := startStack(t, stackOptions{viaProxy: true})
	s.run(t, fault{
		name:   "mysql unreachable and back",
		before: 2 * time.Second, during: 5 * time.Second, after: 2 * time.Second,
		allow503: true,
		begin:    func() { s.proxy.Cut() },
		end:      func() { s.proxy.Restore() },
	})
}

// 4. The workflow engine's receiver answers 503 to every event for ten
// seconds while results arrive, then 2xx again. Within 15 s of its return
// every event is delivered (each distinct event id at least once), with the
// worker's backoff capped at 10 s.
func TestReceiverDownAndBack(t *testing.T) {
	s := startStack(t, stackOptions{})
	s.run(t, fault{
		name:   "receiver answering 503 and back",
		before: 2 * time.Second, during: 10 * time.Second, after: 2 * time.Second,
		begin: func() { s.rcv.setDown(true) },
		end:   func() { s.rcv.setDown(false) },
	})
}

// ---------------------------------------------------------------------------
// the workflow engine's receiver

// receiver is the workflow engine's callback endpoint. It deduplicates on
// event_id, records when each event first arrived, counts redeliveries, and
// checks that one enrollment's completion of one step always comes under
// one event id.
type receiver struct {
	delay   time.Duration // how long each answer takes (set before use)
	mu      sync.Mutex
	down    bool
	first   map[string]time.Time // event_id → first acknowledged arrival
	byPair  map[string]string    // "step_id/enrollment" → event_id
	posts   int                  // every POST, refused ones included
	dups    int                  // acknowledged again after a first 2xx
	refused int                  // answered 503 while down
	wrong   []string             // contract violations seen
}

func newReceiver(delay time.Duration) *receiver {
	return &receiver{delay: delay, first: map[string]time.Time{}, byPair: map[string]string{}}
}

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
	// a slow engine: the event counts as received even if the worker is
	// gone by the time it answers, as with a real receiver
	time.Sleep(r.delay)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.posts++
	if err != nil || ev.EventID == "" {
		r.wrong = append(r.wrong, fmt.Sprintf("unreadable event (%v): %.200s", err, body))
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if r.down {
		r.refused++
		http.Error(w, "down for the test", http.StatusServiceUnavailable)
		return
	}
	if h := req.Header.Get("X-Stepcollect-Event-Id"); h != ev.EventID {
		r.wrong = append(r.wrong, fmt.Sprintf("X-Stepcollect-Event-Id %q for body event_id %q", h, ev.EventID))
	}
	if ev.Type != "step.completed" || len(ev.Step.IDs) != 1 {
		r.wrong = append(r.wrong, fmt.Sprintf("event %s: type %q with ids %v, want one enrollment's step.completed", ev.EventID, ev.Type, ev.Step.IDs))
	}
	pair := fmt.Sprintf("%d/%s", ev.Step.StepID, strings.Join(ev.Step.IDs, ","))
	if prev, ok := r.byPair[pair]; ok && prev != ev.EventID {
		r.wrong = append(r.wrong, fmt.Sprintf("step/enrollment %s delivered under event ids %s and %s", pair, prev, ev.EventID))
	}
	r.byPair[pair] = ev.EventID
	if _, ok := r.first[ev.EventID]; ok {
		r.dups++
	} else {
		r.first[ev.EventID] = now
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) setDown(down bool) {
	r.mu.Lock()
	r.down = down
	r.mu.Unlock()
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

type receiverStats struct{ distinct, posts, dups, refused, pairs int }

func (r *receiver) stats() receiverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return receiverStats{len(r.first), r.posts, r.dups, r.refused, len(r.byPair)}
}

func (r *receiver) violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.wrong...)
}

// ---------------------------------------------------------------------------
// the stack

// stack is one api and one worker (at default flags) on a fresh database
// and a private Redis, optionally reaching MySQL through a proxy.
type stack struct {
	db         *testkit.DB
	redis      *testkit.Redis
	proxy      *tcpproxy.Proxy // nil unless MySQL is reached through it
	rcv        *receiver
	env        []string
	workerAddr string
	callback   string
	apiURL     string
	api        *testkit.Proc
	client     *http.Client

	mu      sync.Mutex
	workers []*testkit.Proc  // every worker started, the current one last
	steps   map[int64]string // step id → what it is, for reports
	// queuedAtFault is what collect tasks in Redis held a moment before
	// the fault (step id → task state), when the test looked
	queuedAtFault map[int64]string
	queuedErr     error
}

// queuedSteps lists the steps that collect tasks in Redis hold right now,
// with the state of their task (pending, active, scheduled, retry).
func (s *stack) queuedSteps() (map[int64]string, error) {
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: fmt.Sprintf("127.0.0.1:%d", s.redis.Port), DialTimeout: time.Second})
	defer insp.Close()
	out := map[int64]string{}
	for _, l := range []struct {
		state string
		list  func(string, ...asynq.ListOption) ([]*asynq.TaskInfo, error)
	}{{"pending", insp.ListPendingTasks}, {"active", insp.ListActiveTasks}, {"scheduled", insp.ListScheduledTasks}, {"retry", insp.ListRetryTasks}} {
		infos, err := l.list(tasks.QueueCollect, asynq.PageSize(1000))
		if errors.Is(err, asynq.ErrQueueNotFound) {
			continue
		} else if err != nil {
			return out, err
		}
		for _, ti := range infos {
			if ti.Type != tasks.TypeCollect {
				continue
			}
			p, err := tasks.ParseCollect(asynq.NewTask(ti.Type, ti.Payload))
			if err != nil {
				return out, err
			}
			for _, st := range p.Steps {
				out[st.ID] = l.state
			}
		}
	}
	return out, nil
}

// stackOptions vary the stack from one test to another.
type stackOptions struct {
	viaProxy      bool          // reach MySQL through a tcpproxy
	receiverDelay time.Duration // how long the receiver takes to answer
}

func startStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	s := &stack{db: testkit.NewDB(t, nil), redis: testkit.StartRedis(t), rcv: newReceiver(o.receiverDelay), steps: map[int64]string{}}
	cb := httptest.NewServer(s.rcv)
	t.Cleanup(cb.Close)
	s.callback = cb.URL

	dsn := s.db.DSN
	if o.viaProxy {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		s.proxy = tcpproxy.Start(t, cfg.Addr)
		cfg.Addr = s.proxy.Addr
		dsn = cfg.FormatDSN()
	}
	// nothing else: every other flag at its default
	s.env = []string{"STEPCOLLECT_MYSQL_DSN=" + dsn, "STEPCOLLECT_REDIS_URL=" + s.redis.URL}
	s.workerAddr = testkit.FreeAddr(t)
	s.startWorker(t)
	testkit.AwaitHTTP(t, s.worker(), "http://"+s.workerAddr+"/readyz", 30*time.Second)

	apiAddr := testkit.FreeAddr(t)
	s.api = testkit.StartProc(t, bins["api"], append(s.env, "STEPCOLLECT_API_KEY="+apiKey), "-listen", apiAddr)
	s.apiURL = "http://" + apiAddr
	testkit.AwaitHTTP(t, s.api, s.apiURL+"/readyz", 30*time.Second)
	s.client = &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	return s
}

// startWorker starts a worker on the stack's flags (the same every time).
func (s *stack) startWorker(t *testing.T) *testkit.Proc {
	p := testkit.StartProc(t, bins["worker"], s.env, "-metrics-listen", s.workerAddr, "-callback-url", s.callback)
	s.mu.Lock()
	s.workers = append(s.workers, p)
	s.mu.Unlock()
	return p
}

func (s *stack) worker() *testkit.Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workers[len(s.workers)-1]
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

func ownID(i int) string   { return fmt.Sprintf("REC-E%04d", i) }
func ownUUID(i int) string { return fmt.Sprintf("REC-OWN-%04d", i) }
func sharedUUID() string   { return "REC-SHARED-1" }
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

// enqueue makes a step of its own for each of n enrollments and one step
// shared by all of them.
func (s *stack) enqueue(t *testing.T, n int) {
	t.Helper()
	auth := map[string]string{"Authorization": "Bearer " + apiKey}
	mk := func(instance string, ids []string, uuid, what string) error {
		body, _ := json.Marshal(map[string]any{"workflow_name": "io.example.recovery", "instance_id": instance, "step_name": "query",
			"ids": ids, "commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation"}}})
		status, b, err := s.post("/v1/steps", body, auth)
		if err != nil || status != http.StatusCreated {
			return fmt.Errorf("enqueue %s: %d %s %v", what, status, b, err)
		}
		var out struct {
			StepID int64 `json:"step_id"`
		}
		if err := json.Unmarshal(b, &out); err != nil {
			return fmt.Errorf("enqueue %s: %s: %v", what, b, err)
		}
		s.mu.Lock()
		s.steps[out.StepID] = what
		s.mu.Unlock()
		return nil
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = ownID(i)
	}
	if err := mk("shared", ids, sharedUUID(), "the shared step"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var errs []error
	forEach(n, 8, func(i int) {
		if err := mk(ownUUID(i), []string{ownID(i)}, ownUUID(i), "the own step of "+ownID(i)); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	if len(errs) > 0 {
		t.Fatalf("%d enqueues failed, first: %v", len(errs), errs[0])
	}
}

// result is one webhook body: enrollment i answering its own command or the
// shared one.
type result struct {
	i      int
	shared bool
}

func (r result) body() []byte {
	id, uuid := ownID(r.i), ownUUID(r.i)
	if r.shared {
		uuid = sharedUUID()
	}
	raw := fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>CommandUUID</key><string>%s</string><key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string><key>QueryResponses</key><dict><key>SerialNumber</key><string>SN-%s</string></dict></dict></plist>`, uuid, id, id)
	return fmt.Appendf(nil, `{"topic":"mdm.Connect","event_id":"%s-%s","created_at":%q,"acknowledge_event":{"udid":%q,"command_uuid":%q,"raw_payload":%q}}`,
		id, uuid, time.Now().UTC().Format(time.RFC3339), id, uuid, base64.StdEncoding.EncodeToString(raw))
}

// tally counts the webhook answers.
type tally struct {
	mu          sync.Mutex
	ok          int
	unavailable int      // 503
	other       []string // anything else, which no fault here excuses
	again       []result // answered 503, to send again
	lastOK      time.Time
	slowest     map[int]time.Duration // by status (0: no answer)
}

func (ta *tally) send(s *stack, r result) {
	start := time.Now()
	status, b, err := s.post("/webhook", r.body(), nil)
	took := time.Since(start)
	ta.mu.Lock()
	defer ta.mu.Unlock()
	if ta.slowest == nil {
		ta.slowest = map[int]time.Duration{}
	}
	ta.slowest[status] = max(ta.slowest[status], took)
	switch {
	case err == nil && status == http.StatusOK:
		ta.ok++
		ta.lastOK = time.Now()
	case err == nil && status == http.StatusServiceUnavailable:
		ta.unavailable++
		ta.again = append(ta.again, r)
	default:
		ta.other = append(ta.other, fmt.Sprintf("%s/%v: %d %.200s %v", ownID(r.i), r.shared, status, b, err))
	}
}

// stream sends rs at an even pace over d (at most width at once) and
// closes the returned channel when every answer is in.
func (s *stack) stream(rs []result, d time.Duration, width int, ta *tally) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		var wg sync.WaitGroup
		sem := make(chan struct{}, width)
		start := time.Now()
		for k, r := range rs {
			// pacing the load, not waiting for a condition
			time.Sleep(time.Until(start.Add(d * time.Duration(k) / time.Duration(len(rs)))))
			sem <- struct{}{}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				ta.send(s, r)
			}()
		}
		wg.Wait()
	}()
	return done
}

// ---------------------------------------------------------------------------
// the run

// fault is what a test does to the stack while results arrive.
type fault struct {
	name                  string
	before, during, after time.Duration // results arrive through all three
	allow503              bool          // webhooks may answer 503 during it
	begin, end            func()
}

func (s *stack) countSteps(t *testing.T) testkit.StepRows { return testkit.CountStepRows(t, s.db.DB) }

func (s *stack) outboxRows(t *testing.T) int {
	var n int
	if err := s.db.QueryRow(`SELECT COUNT(*) FROM stepcollect_outbox`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
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

func (s *stack) run(t *testing.T, f fault) {
	n := enrollments()
	s.enqueue(t, n)
	wantSteps := s.countSteps(t).Steps
	wantEvents := 2 * n // each enrollment completes its own step and the shared one
	if wantSteps != n+1 {
		t.Fatalf("%d steps enqueued, want %d", wantSteps, n+1)
	}

	// enrollment i answers its own command, then the shared one a moment
	// later: the shared step is released by the last result of all
	rs := make([]result, 0, 2*n)
	for i := range n {
		rs = append(rs, result{i: i}, result{i: i, shared: true})
	}
	// The fault begins half a second after a sweep slot, so that no
	// periodic sweep runs between its start and the deadline: recovery
	// within the bound must not depend on where the sweeper's 30 s cycle
	// happens to be (at a lucky phase a sweep right after the fault would
	// hide what else was slow).
	if f.during+bound+time.Second > sweepInterval {
		t.Fatalf("%v of fault and %v of bound do not fit between two sweeps", f.during, bound)
	}
	faultStart := time.Now().Add(f.before).Truncate(sweepInterval).Add(sweepInterval + 500*time.Millisecond)
	time.Sleep(time.Until(faultStart.Add(-f.before))) // placing the fault, not waiting for a condition

	ta := &tally{}
	began := time.Now()
	done := s.stream(rs, f.before+f.during+f.after, 32, ta)

	// the fault's own schedule
	time.Sleep(time.Until(began.Add(f.before)))
	faultAt := time.Now()
	f.begin()
	time.Sleep(time.Until(faultAt.Add(f.during)))
	f.end()
	ended := time.Now()
	deadline := ended.Add(bound)
	rel := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(ended).Round(time.Millisecond).String()
	}
	s.mu.Lock()
	if s.queuedAtFault != nil || s.queuedErr != nil {
		byState := map[string]int{}
		for _, st := range s.queuedAtFault {
			byState[st]++
		}
		t.Logf("just before the fault, collect tasks in Redis held %d steps %v (listing them: %v)", len(s.queuedAtFault), byState, s.queuedErr)
	}
	s.mu.Unlock()
	t.Logf("%s: fault from %v to %v after the first result (%v), %v into a sweep slot (next periodic sweep %v after the fault's end); results paced over %v",
		f.name, faultAt.Sub(began).Round(time.Millisecond), ended.Sub(began).Round(time.Millisecond),
		ended.Sub(faultAt).Round(time.Millisecond), faultAt.Sub(faultAt.Truncate(sweepInterval)).Round(time.Millisecond),
		faultAt.Truncate(sweepInterval).Add(sweepInterval).Sub(ended).Round(time.Millisecond), f.before+f.during+f.after)

	<-done
	ta.mu.Lock()
	streamed503, again := ta.unavailable, ta.again
	ta.again = nil
	ta.mu.Unlock()
	// results answered 503 are sent again, as the test needs every
	// enrollment done; a 503 that persists after the fault ended is retried
	// until the deadline (the loop is the sender's retry, not a wait)
	rounds := 0
	for len(again) > 0 && time.Now().Before(deadline) {
		if rounds > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		rounds++
		forEach(len(again), 32, func(k int) { ta.send(s, again[k]) })
		ta.mu.Lock()
		again, ta.again = ta.again, nil
		ta.mu.Unlock()
	}
	ta.mu.Lock()
	ok, unavailable, other, lastOK := ta.ok, ta.unavailable, ta.other, ta.lastOK
	slowest := fmt.Sprintf("slowest 200 %v", ta.slowest[http.StatusOK].Round(time.Millisecond))
	if unavailable > 0 {
		slowest += fmt.Sprintf(", slowest 503 %v", ta.slowest[http.StatusServiceUnavailable].Round(time.Millisecond))
	}
	ta.mu.Unlock()
	t.Logf("webhooks: %d answered 200 (last %v after the fault ended), %d answered 503 (%d while streaming, sent again in %d rounds), %d other; %s",
		ok, rel(lastOK), unavailable, streamed503, rounds, len(other), slowest)
	if len(other) > 0 {
		t.Errorf("%d webhooks answered neither 200 nor 503, first: %s", len(other), other[0])
	}
	if unavailable > 0 && !f.allow503 {
		t.Errorf("%d webhooks answered 503 during %s: a 200 was due (the result is committed, MySQL is up)", unavailable, f.name)
	}
	if len(again) > 0 {
		t.Errorf("%d results still answered 503 %v after the fault ended", len(again), bound)
	}
	if ok != 2*n {
		t.Errorf("%d results answered 200, want %d", ok, 2*n)
	}

	// Every 20 ms, note when each condition first holds (results are all
	// committed by now, so each only goes one way).
	var collectedAt, deliveredAt, drainedAt time.Time
	progress := func() bool {
		now := time.Now()
		if collectedAt.IsZero() && s.countSteps(t).Steps == 0 {
			collectedAt = now
		}
		if deliveredAt.IsZero() && s.rcv.distinct() >= wantEvents {
			deliveredAt = now
		}
		if drainedAt.IsZero() && s.outboxRows(t) == 0 {
			drainedAt = now
		}
		return !collectedAt.IsZero() && !deliveredAt.IsZero() && !drainedAt.IsZero()
	}
	if _, ok := watch(deadline, progress); !ok {
		collectedOK, deliveredOK, drainedOK := !collectedAt.IsZero(), !deliveredAt.IsZero(), !drainedAt.IsZero()
		s.explain(t, ended, wantEvents)
		watch(deadline.Add(overtime), progress) // how late: keep watching
		if !collectedOK {
			t.Errorf("steps: not all collected within %v of the fault's end; %s", bound, late(!collectedAt.IsZero(), collectedAt, ended, overtime+bound))
		}
		if !deliveredOK {
			t.Errorf("events: not all delivered within %v of the fault's end; %s", bound, late(!deliveredAt.IsZero(), s.rcv.last(), ended, overtime+bound))
		}
		if !drainedOK {
			t.Errorf("outbox: not empty within %v of the fault's end; %s", bound, late(!drainedAt.IsZero(), drainedAt, ended, overtime+bound))
		}
		t.Logf("after the overtime: %s", s.state(t, wantEvents))
	}

	st := s.rcv.stats()
	sinceLastOK := func(at time.Time) string {
		if at.IsZero() {
			return "never"
		}
		return at.Sub(lastOK).Round(time.Millisecond).String()
	}
	t.Logf("RECOVERY %s: steps collected after %v, last event after %v (from the fault's end); the last result was answered 200 at %v, "+
		"so %v and %v after it; outbox empty (every event acknowledged) after %v; %d distinct events, %d redelivered, %d refused while down, %d POSTs in all",
		f.name, rel(collectedAt), rel(s.rcv.last()), rel(lastOK), sinceLastOK(collectedAt), sinceLastOK(s.rcv.last()), rel(drainedAt),
		st.distinct, st.dups, st.refused, st.posts)
	if st.distinct != wantEvents || st.pairs != wantEvents {
		t.Errorf("receiver: %d distinct event ids for %d step/enrollment completions, want %d of each", st.distinct, st.pairs, wantEvents)
	}
	for _, v := range s.rcv.violations() {
		t.Errorf("receiver: %s", v)
	}
	if r := s.countSteps(t); r.Steps != 0 || r.IDCommands != 0 || r.StepCommands != 0 {
		t.Errorf("left: %+v", r)
	}
	s.logDigest(t, ended)
	if t.Failed() {
		return // the procs' logs are printed by testproc
	}
	if err := s.api.Stop(); err != nil {
		t.Errorf("api on SIGTERM: %v", err)
	}
	if err := s.worker().Stop(); err != nil {
		t.Errorf("worker on SIGTERM: %v", err)
	}
}

func late(ok bool, at, ended time.Time, watched time.Duration) string {
	if !ok {
		return fmt.Sprintf("still not after %v", watched)
	}
	return fmt.Sprintf("done %v after the fault's end (%v late)", at.Sub(ended).Round(time.Millisecond), (at.Sub(ended) - bound).Round(time.Millisecond))
}

// state is one line on what is left.
func (s *stack) state(t *testing.T, wantEvents int) string {
	r := s.countSteps(t)
	st := s.rcv.stats()
	return fmt.Sprintf("%d steps, %d id_commands rows, %d step_commands rows left; %d outbox rows; %d of %d events delivered (%d redelivered, %d refused)",
		r.Steps, r.IDCommands, r.StepCommands, s.outboxRows(t), st.distinct, wantEvents, st.dups, st.refused)
}

// explain logs, at the deadline, what was left and why it might be: the
// steps (and whether anything still refers to them), the outbox, the
// queue and the worker's counters.
func (s *stack) explain(t *testing.T, ended time.Time, wantEvents int) {
	t.Logf("at the deadline (%v after the fault's end): %s", time.Since(ended).Round(time.Millisecond), s.state(t, wantEvents))
	rows, err := s.db.Query(`SELECT s.id, (SELECT COUNT(*) FROM id_commands c WHERE c.step_id = s.id) FROM steps s ORDER BY s.id LIMIT 20`)
	if err == nil {
		for rows.Next() {
			var id int64
			var refs int
			rows.Scan(&id, &refs)
			s.mu.Lock()
			what := s.steps[id]
			if st, ok := s.queuedAtFault[id]; ok {
				what += "; in a collect task " + st + " in Redis just before the fault"
			} else if s.queuedAtFault != nil {
				what += "; in no collect task in Redis just before the fault"
			}
			s.mu.Unlock()
			t.Logf("  step %d (%s) left, %d id_commands rows refer to it", id, what, refs)
		}
		rows.Close()
	} else {
		t.Logf("  listing steps: %v", err)
	}
	var pending, maxAttempts int
	var lastError sql.NullString
	if err := s.db.QueryRow(`SELECT COUNT(*), COALESCE(MAX(attempts), 0), MAX(last_error) FROM stepcollect_outbox`).Scan(&pending, &maxAttempts, &lastError); err == nil {
		t.Logf("  outbox: %d rows, attempts up to %d, a last_error: %.200s", pending, maxAttempts, lastError.String)
	} else {
		t.Logf("  outbox: %v", err)
	}
	insp := asynq.NewInspector(asynq.RedisClientOpt{Addr: fmt.Sprintf("127.0.0.1:%d", s.redis.Port), DialTimeout: time.Second})
	defer insp.Close()
	for _, q := range []string{"stepcollect", "stepcollect_sweep"} {
		qi, err := insp.GetQueueInfo(q)
		if err != nil {
			t.Logf("  queue %s: %v", q, err)
			continue
		}
		t.Logf("  queue %s: pending %d, active %d, scheduled %d, retry %d, archived %d, completed %d; processed today %d, failed today %d",
			q, qi.Pending, qi.Active, qi.Scheduled, qi.Retry, qi.Archived, qi.Completed, qi.Processed, qi.Failed)
	}
	if fams, err := scrape.Families("http://" + s.workerAddr + "/metrics"); err == nil {
		t.Logf("  worker metrics: steps_collected_total %.0f; collect_runs collected %.0f referenced %.0f claimed_elsewhere %.0f gone %.0f error %.0f; uncollected_steps %.0f; deliveries ok %.0f http_error %.0f timeout %.0f",
			scrape.Value(fams, "stepcollect_steps_collected_total"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "collected"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "referenced"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "claimed_elsewhere"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "gone"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "error"),
			scrape.Value(fams, "stepcollect_uncollected_steps"),
			scrape.Value(fams, "stepcollect_deliveries_total", "outcome", "ok"),
			scrape.Value(fams, "stepcollect_deliveries_total", "outcome", "http_error"),
			scrape.Value(fams, "stepcollect_deliveries_total", "outcome", "timeout"))
	} else {
		t.Logf("  worker metrics: %v", err)
	}
}

// logDigest summarises what the binaries logged (info and above), one line
// per kind of message, with how often and when, relative to the fault's
// end.
func (s *stack) logDigest(t *testing.T, ended time.Time) {
	procs := []struct {
		name string
		p    *testkit.Proc
	}{{"api", s.api}}
	s.mu.Lock()
	for i, w := range s.workers {
		procs = append(procs, struct {
			name string
			p    *testkit.Proc
		}{fmt.Sprintf("worker#%d", i+1), w})
	}
	s.mu.Unlock()
	type group struct {
		n                  int
		first, last        time.Time
		sample, lastSample string
	}
	for _, pr := range procs {
		groups := map[string]*group{}
		var keys []string
		for _, line := range strings.Split(pr.p.Logs(), "\n") {
			var m map[string]any
			if json.Unmarshal([]byte(line), &m) != nil {
				continue
			}
			str := func(k string) string { v, _ := m[k].(string); return v }
			key := fmt.Sprintf("%s [%s] %s", str("level"), str("component"), str("message"))
			if st, ok := m["status"].(float64); ok {
				key += fmt.Sprintf(" status=%v", st)
			}
			at, _ := time.Parse(time.RFC3339Nano, str("time"))
			sample := str("error")
			for _, k := range []string{"examined", "unreferenced", "collected", "count"} {
				if v, ok := m[k]; ok {
					sample += fmt.Sprintf(" %s=%v", k, v)
				}
			}
			sample = strings.TrimSpace(sample)
			g := groups[key]
			if g == nil {
				g = &group{first: at, sample: sample}
				groups[key] = g
				keys = append(keys, key)
			}
			g.n++
			g.last, g.lastSample = at, sample
		}
		sort.Slice(keys, func(i, j int) bool { return groups[keys[i]].first.Before(groups[keys[j]].first) })
		var b strings.Builder
		for _, k := range keys {
			g := groups[k]
			fmt.Fprintf(&b, "\n  %s ×%d, %v … %v", k, g.n, g.first.Sub(ended).Round(time.Millisecond), g.last.Sub(ended).Round(time.Millisecond))
			if g.sample != "" {
				fmt.Fprintf(&b, " (%.160s)", g.sample)
			}
			if g.n > 1 && g.lastSample != g.sample {
				fmt.Fprintf(&b, " (last: %.160s)", g.lastSample)
			}
		}
		t.Logf("%s logged (times from the fault's end):%s", pr.name, b.String())
	}
}
