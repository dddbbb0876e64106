package failover

import (
	"net/http"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
)

// Redis behind Sentinel: a primary (redis-a), its replica (redis-b) and
// three Sentinels (quorum 2, down-after 1 s, failover-timeout 5 s), the api
// and the worker on redis-sentinel://<the three>?master=m.
//
//  1. In the middle of a fan-out redis-a is SIGKILLed. Every webhook
//     answers 200 (the commit does not need Redis); Sentinel promotes
//     redis-b; the api and the worker follow without a restart, and within
//     15 s of the promotion every step is collected and every event
//     delivered.
//  2. redis-a is started again (configured as a primary, as its own
//     configuration file would have it, and empty: no persistence);
//     Sentinel turns it into a replica of redis-b. In the middle of another
//     fan-out a failover back to it is asked of Sentinel (SENTINEL
//     FAILOVER, as before maintenance): the same bound holds.
//  3. In the middle of a third fan-out redis-a hangs (SIGSTOP: the kernel
//     still accepts connections for it, nothing is answered), as a host
//     that freezes or a network that drops packets, and resumes (SIGCONT)
//     right after Sentinel promoted redis-b, a stale primary that answers
//     what was sent to it meanwhile: the same bound holds.
//
// The api's and the worker's pids stay the same throughout: both follow
// every promotion without a restart.
func TestRedisSentinelFailover(t *testing.T) {
	sen := testha.StartSentinel(t, testha.SentinelConfig{})
	db := testkit.NewDB(t, nil)
	s := startStack(t, db.DSN, sen.URL, db.DB)
	a, b := sen.Servers[0], sen.Servers[1]
	n := enrollments()

	failoverRound(t, s, sen, "R1", n, "primary SIGKILLed", a, b, func() { a.Kill() }, nil)
	mustHaveSettled(t, s)

	restarted := time.Now()
	a.Restart()
	rejoined, err := sen.AwaitReplica(a, b, 60*time.Second)
	if err != nil {
		t.Fatalf("the old primary did not rejoin as a replica: %v", err)
	}
	healthy, err := sen.AwaitHealthy(a, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FAILOVER old primary restarted: a replica in sync %v later (Sentinel converts a returning primary after 8 s), every Sentinel sees it fit %v after that",
		rejoined.Round(time.Millisecond), healthy.Round(time.Millisecond))

	failoverRound(t, s, sen, "R2", n, "SENTINEL FAILOVER back", b, a, func() {
		if err := sen.Failover(10 * time.Second); err != nil {
			t.Error(err)
		}
	}, nil)
	if took, err := sen.AwaitReplica(b, a, 30*time.Second); err != nil {
		t.Error(err)
	} else {
		t.Logf("FAILOVER after the failback the demoted primary was a replica in sync %v after the round", took.Round(time.Millisecond))
	}
	mustHaveSettled(t, s)

	// 3. the primary hangs (SIGSTOP: connections accepted by the kernel,
	// nothing answered) and resumes right after the promotion, a stale
	// primary answering what was sent to it meanwhile
	failoverRound(t, s, sen, "R3", n, "primary frozen", a, b, func() { a.Freeze() }, func() { a.Thaw() })
	mustHaveSettled(t, s)
	t.Logf("Sentinel events (the old primary restarted at %v):\n  %s", restarted.Format("15:04:05.000"), joinLines(sen.Events()))
	s.StillRunning(t)
	if !t.Failed() {
		s.Stop(t)
	}
}

// mustHaveSettled stops the test unless the rounds so far have left
// nothing behind (a round that missed its bound but settled later still
// lets the next one run and be measured).
func mustHaveSettled(t *testing.T, s *testkit.Stack) {
	t.Helper()
	if left := s.Left(t); left.Steps != 0 || left.IDCommands != 0 || left.Outbox != 0 || s.Rcv.Distinct() != s.WantEvents {
		t.Fatalf("not settled: %s left, %d of %d events delivered", left, s.Rcv.Distinct(), s.WantEvents)
	}
}

func joinLines(xs []string) string {
	out := ""
	for i, x := range xs {
		if i > 0 {
			out += "\n  "
		}
		out += x
	}
	return out
}

// failoverRound enqueues a round, sends its results over 6 s, runs fault
// 2 s in, waits for the Sentinels to name to instead of from, and holds
// the round to the bound from that promotion.
func failoverRound(t *testing.T, s *testkit.Stack, sen *testha.Sentinel, prefix string, n int, name string, from, to *testha.Redis, fault, afterPromotion func()) {
	t.Helper()
	if got := sen.MasterAddrs(t.Context()); got[0] != from.Addr() {
		t.Fatalf("%s: the Sentinels name %v as the primary, want %s", name, got, from.Addr())
	}
	r := s.EnqueueRound(t, prefix, n)
	const before, total = 2 * time.Second, 6 * time.Second
	began := time.Now()
	done := s.Stream(r.Results(), total, 32)
	// the fault's own schedule, not a wait for a condition
	atScheduled(began.Add(before))
	faultAt := time.Now()
	fault()
	p, err := sen.AwaitPromotion(from.Addr(), 30*time.Second)
	if err != nil {
		t.Fatalf("%s: %v\nSentinel events:\n  %s", name, err, joinLines(sen.Events()))
	}
	if p.To != to.Addr() {
		t.Errorf("%s: the Sentinels promoted %s, want %s", name, p.To, to.Addr())
	}
	promoted := p.First
	if afterPromotion != nil {
		afterPromotion()
	}
	probe := &http.Client{Timeout: 2 * time.Second}
	readyAt, ready := testkit.Watch(promoted.Add(bound), func() bool {
		resp, err := probe.Get("http://" + s.WorkerAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	if !ready {
		t.Errorf("%s: the worker's /readyz not 200 within %v of the promotion", name, bound)
	}

	answers := <-done
	var ok, bad int
	var tooks, during []time.Duration
	for _, a := range answers {
		tooks = append(tooks, a.Took())
		if a.End.After(faultAt) && a.Start.Before(promoted) {
			during = append(during, a.Took())
		}
		if a.Err == nil && a.Status == http.StatusOK {
			ok++
			continue
		}
		// the commit does not need Redis: anything but 200 is wrong
		if bad++; bad <= 5 {
			t.Errorf("%s: webhook %s answered %d %q %v (sent %v after the fault)", name, a.X, a.Status, a.Body, a.Err, a.Start.Sub(faultAt).Round(time.Millisecond))
		}
	}
	if ok != len(answers) {
		t.Errorf("%s: %d of %d webhooks answered 200", name, ok, len(answers))
	}
	st := s.AwaitSettled(t, promoted, name, func() { s.Explain(t, promoted, nil) })
	t.Logf("FAILOVER %s: promoted %v after the fault (every Sentinel agreeing %v after it); after the promotion: %s; worker /readyz 200 %v after it",
		name, promoted.Sub(faultAt).Round(time.Millisecond), p.All.Sub(faultAt).Round(time.Millisecond), st,
		readyAt.Sub(promoted).Round(time.Millisecond))
	t.Logf("FAILOVER %s: webhooks: %d of %d answered 200; p50 %v, p99 %v, slowest %v; %d answered while the primary was gone, slowest of those %v",
		name, ok, len(answers), percentile(tooks, 50).Round(time.Millisecond), percentile(tooks, 99).Round(time.Millisecond),
		percentile(tooks, 100).Round(time.Millisecond), len(during), percentile(during, 100).Round(time.Millisecond))
	s.CheckReceiver(t)
	s.LogMetrics(t)
	s.LogDigest(t, began, faultAt, true)
}
