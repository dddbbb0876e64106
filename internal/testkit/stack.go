package testkit

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// Guarantee 8 of docs/reference.md ("Guarantees"), which the fault tests hold the service to.
const (
	// SettleBound is how soon after a fault ends every step must be
	// collected and every event delivered.
	SettleBound = 15 * time.Second
	// SettleOvertime is how much longer a test that missed the bound keeps
	// watching, to report how late the work was (two sweep intervals).
	SettleOvertime = 60 * time.Second
)

// StackConfig is what a Stack runs on.
type StackConfig struct {
	Bins          map[string]string // "api" and "worker"; MainServices's if nil
	DSN, RedisURL string
	DB            *sql.DB // the test's own view of the database
	APIKey        string
	Env           []string // more environment for both binaries (NAME=value)
	APIEnv        []string // and for the api alone
	WorkerArgs    []string // more flags for the worker
	// Receiver, when set, starts a Receiver and points the worker's
	// -callback-url at it.
	Receiver *ReceiverOptions
	// ProbeStalls starts a StallProbe on DB: AwaitSettled's bound then
	// grows by what the database itself stood still after the fault.
	ProbeStalls bool
}

// Stack is one api and one worker, the built binaries, running against a
// DSN and a Redis URL, as a deployment runs them; every flag the
// configuration does not set stays at its default.
type Stack struct {
	cfg        StackConfig
	DB         *sql.DB
	Rcv        *Receiver // nil unless StackConfig.Receiver
	API        *Proc
	APIURL     string
	WorkerAddr string
	Client     *Client
	Stalls     *StallProbe // nil unless StackConfig.ProbeStalls
	// WantEvents is how many distinct step.completed events the rounds
	// enqueued so far must end in.
	WantEvents int

	mu      sync.Mutex
	workers []*Proc          // every worker started, the current one last
	steps   map[int64]string // step id → what it is, for reports
}

// StartStack starts the worker, waits until it is ready, then the api.
func StartStack(t testing.TB, cfg StackConfig) *Stack {
	t.Helper()
	if cfg.Bins == nil {
		cfg.Bins = services
	}
	s := &Stack{cfg: cfg, DB: cfg.DB, steps: map[int64]string{}}
	if cfg.ProbeStalls {
		s.Stalls = StartStallProbe(t, cfg.DB)
	}
	if cfg.Receiver != nil {
		s.Rcv = NewReceiver(t, *cfg.Receiver)
		s.cfg.WorkerArgs = append([]string{"-callback-url", s.Rcv.URL}, cfg.WorkerArgs...)
	}
	s.WorkerAddr = FreeAddr(t)
	s.StartWorker(t)
	AwaitHTTP(t, s.Worker(), "http://"+s.WorkerAddr+"/readyz", 30*time.Second)
	env := append(ServiceEnv(cfg.DSN, cfg.RedisURL, cfg.Env...), "STEPCOLLECT_API_KEY="+cfg.APIKey)
	s.API, s.APIURL = StartService(t, cfg.Bins["api"], append(env, cfg.APIEnv...), "listen")
	s.Client = NewClient(s.APIURL, cfg.APIKey)
	return s
}

// MetricsURL is the worker's /metrics.
func (s *Stack) MetricsURL() string { return "http://" + s.WorkerAddr + "/metrics" }

// StartWorker starts a worker on the stack's flags and address (the same
// every time) without waiting for it.
func (s *Stack) StartWorker(t testing.TB) *Proc {
	t.Helper()
	p := StartProc(t, s.cfg.Bins["worker"], ServiceEnv(s.cfg.DSN, s.cfg.RedisURL, s.cfg.Env...),
		append([]string{"-metrics-listen", s.WorkerAddr}, s.cfg.WorkerArgs...)...)
	s.mu.Lock()
	s.workers = append(s.workers, p)
	s.mu.Unlock()
	return p
}

// Worker is the worker started last.
func (s *Stack) Worker() *Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.workers[len(s.workers)-1]
}

// Stop stops the api and the worker with SIGTERM; each must exit cleanly.
func (s *Stack) Stop(t testing.TB) {
	t.Helper()
	if err := s.API.Stop(); err != nil {
		t.Errorf("api on SIGTERM: %v", err)
	}
	if err := s.Worker().Stop(); err != nil {
		t.Errorf("worker on SIGTERM: %v", err)
	}
}

// StillRunning fails t unless the api and the worker started first are
// still running: a failover must be followed, not survived by restart.
func (s *Stack) StillRunning(t testing.TB) {
	t.Helper()
	for name, p := range map[string]*Proc{"api": s.API, "worker": s.Worker()} {
		// exited, not ProcessState: nothing waits on a service until the
		// test ends, so one that died is a zombie with no state yet
		if p.exited() {
			t.Errorf("%s %s", name, p.Describe())
		}
	}
}

// ForEach runs f(i) for i in [0,n), at most width at once.
func ForEach(n, width int, f func(i int)) {
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

// Round is one fan-out: a step of its own to each of n enrollments and one
// step shared by all of them, with a prefix in every name.
type Round struct {
	Prefix     string
	N          int
	Own        []int64 // enrollment i's own step
	SharedStep int64
}

func (r *Round) ID(i int) string      { return fmt.Sprintf("%s-E%04d", r.Prefix, i) }
func (r *Round) OwnUUID(i int) string { return fmt.Sprintf("%s-OWN-%04d", r.Prefix, i) }
func (r *Round) SharedUUID() string   { return r.Prefix + "-SHARED" }

// EnqueueRound makes a round's steps through /v1/steps, the shared one
// first, and adds its 2n completions to WantEvents.
func (s *Stack) EnqueueRound(t testing.TB, prefix string, n int) *Round {
	t.Helper()
	r := &Round{Prefix: prefix, N: n, Own: make([]int64, n)}
	mk := func(instance string, ids []string, uuid, what string) (int64, error) {
		id, err := s.Client.Enqueue(V1Step(instance, ids, uuid))
		if err != nil {
			return 0, fmt.Errorf("%s: %w", what, err)
		}
		s.mu.Lock()
		s.steps[id] = what
		s.mu.Unlock()
		return id, nil
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = r.ID(i)
	}
	var err error
	if r.SharedStep, err = mk(prefix+"-shared", ids, r.SharedUUID(), prefix+": the shared step"); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var errs []error
	ForEach(n, 8, func(i int) {
		id, err := mk(r.OwnUUID(i), []string{r.ID(i)}, r.OwnUUID(i), prefix+": the own step of "+r.ID(i))
		mu.Lock()
		defer mu.Unlock()
		r.Own[i] = id
		if err != nil {
			errs = append(errs, err)
		}
	})
	if len(errs) > 0 {
		t.Fatalf("%d enqueues failed, first: %v", len(errs), errs[0])
	}
	s.WantEvents += 2 * n
	return r
}

// Result is one webhook body of a round: enrollment I answering its own
// command or the shared one.
type Result struct {
	R      *Round
	I      int
	Shared bool
}

func (x Result) UUID() string {
	if x.Shared {
		return x.R.SharedUUID()
	}
	return x.R.OwnUUID(x.I)
}

func (x Result) StepID() int64 {
	if x.Shared {
		return x.R.SharedStep
	}
	return x.R.Own[x.I]
}

func (x Result) String() string { return x.R.ID(x.I) + "/" + x.UUID() }

// Body is the webhook body NanoMDM sends for it.
func (x Result) Body() []byte { return Acknowledged(x.R.ID(x.I), x.UUID()) }

// Results is every result of r: each enrollment answers its own command,
// then the shared one (the shared step is released by the last of all).
func (r *Round) Results() []Result {
	rs := make([]Result, 0, 2*r.N)
	for i := range r.N {
		rs = append(rs, Result{R: r, I: i}, Result{R: r, I: i, Shared: true})
	}
	return rs
}

// Answer is one webhook call, timed.
type Answer struct {
	X          Result
	Start, End time.Time
	Status     int
	Body       string
	Err        error
}

func (a Answer) Took() time.Duration { return a.End.Sub(a.Start) }

// Send posts x's webhook body.
func (s *Stack) Send(x Result) Answer {
	a := Answer{X: x, Start: time.Now()}
	var b []byte
	a.Status, b, a.Err = s.Client.Webhook(x.Body())
	a.End = time.Now()
	a.Body = strings.TrimSpace(string(b))
	return a
}

// Stream sends rs at an even pace over d (at most width at once) and
// delivers every answer on the returned channel once all are in.
func (s *Stack) Stream(rs []Result, d time.Duration, width int) <-chan []Answer {
	out := make(chan []Answer, 1)
	go func() {
		var mu sync.Mutex
		answers := make([]Answer, 0, len(rs))
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
				a := s.Send(x)
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

// Left is what is left in the database: step rows and outbox rows.
type Left struct {
	StepRows
	Outbox int
}

func (l Left) String() string {
	return fmt.Sprintf("%d steps, %d id_commands rows, %d step_commands rows, %d outbox rows", l.Steps, l.IDCommands, l.StepCommands, l.Outbox)
}

// Left counts what is left.
func (s *Stack) Left(t testing.TB) Left {
	t.Helper()
	return Left{StepRows: CountStepRows(t, s.DB), Outbox: OutboxRows(t, s.DB)}
}

// Settled is when AwaitSettled saw each condition first hold, from its
// from (-1: never).
type Settled struct {
	Collected, Delivered, Drained time.Duration
}

func (st Settled) String() string {
	return fmt.Sprintf("steps collected %v, events delivered %v, outbox empty %v",
		st.Collected.Round(time.Millisecond), st.Delivered.Round(time.Millisecond), st.Drained.Round(time.Millisecond))
}

// Deadline is SettleBound after from, and later by as long as the
// database itself stood still since from (Stalls; nothing without one).
func (s *Stack) Deadline(from time.Time) time.Time {
	return from.Add(SettleBound + s.Stalls.Stalled(from, time.Now()))
}

// AwaitSettled waits until every step is collected, WantEvents distinct
// events are delivered and the outbox is empty, noting when each first
// held, and fails t for whichever did not by Deadline(from). Then it
// calls explain (if not nil) and keeps watching up to SettleOvertime
// more, to say how late.
func (s *Stack) AwaitSettled(t testing.TB, from time.Time, what string, explain func()) Settled {
	t.Helper()
	var collectedAt, deliveredAt, drainedAt time.Time
	check := func() bool {
		now := time.Now()
		left := s.Left(t)
		if collectedAt.IsZero() && left.Steps == 0 {
			collectedAt = now
		}
		if deliveredAt.IsZero() && s.Rcv.Distinct() >= s.WantEvents {
			deliveredAt = s.Rcv.Last()
		}
		if drainedAt.IsZero() && left.Outbox == 0 && !deliveredAt.IsZero() {
			drainedAt = now
		}
		return !collectedAt.IsZero() && !deliveredAt.IsZero() && !drainedAt.IsZero()
	}
	_, ok := watchUntil(func() time.Time { return s.Deadline(from) }, check)
	if !ok {
		if explain != nil {
			explain()
		}
		Watch(s.Deadline(from).Add(SettleOvertime), check)
	}
	// the bound for each is what the database stood still before it was
	// done: a stall after the work was over excuses nothing
	boundFor := func(at time.Time) time.Duration {
		if at.IsZero() {
			at = time.Now()
		}
		return SettleBound + s.Stalls.Stalled(from, at)
	}
	last := time.Time{}
	for _, at := range []time.Time{collectedAt, deliveredAt, drainedAt} {
		if at.IsZero() {
			last = time.Time{}
			break
		}
		if at.After(last) {
			last = at
		}
	}
	if stalled := boundFor(last) - SettleBound; stalled > 0 {
		t.Logf("%s: the database itself stood still for %v after the fault's end (%s): the bound is %v + %v",
			what, stalled.Round(time.Millisecond), s.Stalls, SettleBound, stalled.Round(time.Millisecond))
	}
	for _, c := range []struct {
		name string
		at   time.Time
	}{{"steps collected", collectedAt}, {"events delivered", deliveredAt}, {"outbox empty", drainedAt}} {
		bound := boundFor(c.at)
		switch {
		case c.at.IsZero():
			t.Errorf("%s: %s: not within %v, still not after %v more", what, c.name, bound.Round(time.Millisecond), SettleOvertime)
		case c.at.Sub(from) > bound:
			t.Errorf("%s: %s: not within %v; done after %v (%v late)", what, c.name, bound.Round(time.Millisecond),
				c.at.Sub(from).Round(time.Millisecond), (c.at.Sub(from) - bound).Round(time.Millisecond))
		}
	}
	if !ok {
		t.Logf("%s: after the overtime: %s; %d of %d events delivered (%s)", what, s.Left(t), s.Rcv.Distinct(), s.WantEvents, s.Rcv.Stats())
	}
	since := func(at time.Time) time.Duration {
		if at.IsZero() {
			return -1
		}
		return at.Sub(from)
	}
	return Settled{Collected: since(collectedAt), Delivered: since(deliveredAt), Drained: since(drainedAt)}
}

// CheckReceiver fails t for anything the receiver saw wrong, or for
// completions delivered other than once per step and enrollment.
func (s *Stack) CheckReceiver(t testing.TB) {
	t.Helper()
	st := s.Rcv.Stats()
	if st.Distinct != s.WantEvents || st.Pairs != s.WantEvents {
		t.Errorf("receiver: %d distinct event ids for %d step/enrollment completions, want %d of each", st.Distinct, st.Pairs, s.WantEvents)
	}
	s.Rcv.Check(t)
}

// Explain logs what is left (and, through annotate, what the test knows
// of each step left) and the api's and the worker's counters.
func (s *Stack) Explain(t testing.TB, from time.Time, annotate func(stepID int64) string) {
	t.Helper()
	t.Logf("at the deadline (%v after the fault's end): %s left; %d of %d events delivered (%s)",
		time.Since(from).Round(time.Millisecond), s.Left(t), s.Rcv.Distinct(), s.WantEvents, s.Rcv.Stats())
	rows, err := s.DB.Query(`SELECT s.id, (SELECT COUNT(*) FROM id_commands c WHERE c.step_id = s.id) FROM steps s ORDER BY s.id LIMIT 20`)
	if err != nil {
		t.Logf("  listing steps: %v", err)
	} else {
		unreferenced := 0
		for rows.Next() {
			var id int64
			var refs int
			if err := rows.Scan(&id, &refs); err != nil {
				t.Logf("  listing steps: %v", err)
				break
			}
			s.mu.Lock()
			what := s.steps[id]
			s.mu.Unlock()
			if annotate != nil {
				what += annotate(id)
			}
			t.Logf("  step %d (%s) left, %d id_commands rows refer to it", id, what, refs)
			if refs == 0 {
				unreferenced++
			}
		}
		rows.Close()
		if unreferenced > 0 {
			t.Logf("  %d of those are unreferenced, released by a committed result, and their collect task never ran "+
				"(a queue write lost, or a worker that never took it); only a sweep finds them", unreferenced)
		}
	}
	var pending, maxAttempts int
	var lastError sql.NullString
	if err := s.DB.QueryRow(`SELECT COUNT(*), COALESCE(MAX(attempts), 0), MAX(last_error) FROM stepcollect_outbox`).Scan(&pending, &maxAttempts, &lastError); err == nil {
		t.Logf("  outbox: %d rows, attempts up to %d, a last_error: %.200s", pending, maxAttempts, lastError.String)
	} else {
		t.Logf("  outbox: %v", err)
	}
	s.LogMetrics(t)
}

// LogMetrics logs the counters that say how the hand-off and the worker
// fared.
func (s *Stack) LogMetrics(t testing.TB) {
	t.Helper()
	if fams, err := scrape.Families(s.APIURL + "/metrics"); err == nil {
		t.Logf("  api metrics: results completed_step %.0f error %.0f; enqueue_failures %.0f; handoff_dropped_steps %.0f",
			scrape.Value(fams, "stepcollect_results_total", "outcome", "completed_step"),
			scrape.Value(fams, "stepcollect_results_total", "outcome", "error"),
			scrape.Value(fams, "stepcollect_enqueue_failures_total"),
			scrape.Value(fams, "stepcollect_handoff_dropped_steps_total"))
	} else {
		t.Logf("  api metrics: %v", err)
	}
	if fams, err := scrape.Families(s.MetricsURL()); err == nil {
		t.Logf("  worker metrics: steps_collected %.0f; collect_runs collected %.0f referenced %.0f claimed_elsewhere %.0f gone %.0f error %.0f; "+
			"uncollected_steps %.0f; deliveries ok %.0f http_error %.0f timeout %.0f; tx_retries %.0f",
			scrape.Value(fams, "stepcollect_steps_collected_total"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "collected"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "referenced"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "claimed_elsewhere"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "gone"),
			scrape.Value(fams, "stepcollect_collect_runs_total", "outcome", "error"),
			scrape.Value(fams, "stepcollect_uncollected_steps"),
			scrape.Value(fams, "stepcollect_deliveries_total", "outcome", "ok"),
			scrape.Value(fams, "stepcollect_deliveries_total", "outcome", "http_error"),
			scrape.Value(fams, "stepcollect_deliveries_total", "outcome", "timeout"),
			scrape.Value(fams, "stepcollect_tx_retries_total"))
	} else {
		t.Logf("  worker metrics: %v", err)
	}
}

// LogDigest summarises what the binaries logged since since (every line
// if zero; at warn and above if warnOnly), one line per kind of message,
// with how often and when, relative to from.
func (s *Stack) LogDigest(t testing.TB, since, from time.Time, warnOnly bool) {
	t.Helper()
	type proc struct {
		name string
		p    *Proc
	}
	procs := []proc{{"api", s.API}}
	s.mu.Lock()
	for i, w := range s.workers {
		name := "worker"
		if len(s.workers) > 1 {
			name = fmt.Sprintf("worker#%d", i+1)
		}
		procs = append(procs, proc{name, w})
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
			if lv := str("level"); warnOnly && lv != "warn" && lv != "error" {
				continue
			}
			at, _ := time.Parse(time.RFC3339Nano, str("time"))
			if !since.IsZero() && at.Before(since.Truncate(time.Second)) {
				continue
			}
			key := fmt.Sprintf("%s [%s] %s", str("level"), str("component"), str("message"))
			if st, ok := m["status"].(float64); ok {
				key += fmt.Sprintf(" status=%v", st)
			}
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
			fmt.Fprintf(&b, "\n  %s ×%d, %v … %v", k, g.n, g.first.Sub(from).Round(time.Millisecond), g.last.Sub(from).Round(time.Millisecond))
			if g.sample != "" {
				fmt.Fprintf(&b, " (%.160s)", g.sample)
			}
			if g.n > 1 && g.lastSample != g.sample {
				fmt.Fprintf(&b, " (last: %.160s)", g.lastSample)
			}
		}
		if b.Len() == 0 {
			b.WriteString(" nothing")
		}
		t.Logf("%s logged (times from %s):%s", pr.name, from.Format("15:04:05.000"), b.String())
	}
}
