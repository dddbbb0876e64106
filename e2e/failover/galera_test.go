package failover

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/tcpproxy"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// A three-node MariaDB Galera cluster with the real binaries on two of its
// nodes, unchanged: the api on node 0's address, the worker on node 1's
// (so that every step the api commits is collected, and every event
// delivered, through another node). Node 2 is SIGKILLed in the middle of
// the results and started again once they are all answered.
//
// The two nodes left keep the quorum, so every webhook answers 200; every
// result answered 200 is committed (read back row by row); within 15 s of
// the last answer every step is collected and every event delivered, each
// completion under one event id; and the restarted node, once it has
// caught up, holds no step row either.
func TestGaleraNodeKilledInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGalera(t, 3)
	s, dbName := galeraStack(t, g, fmt.Sprintf("127.0.0.1:%d", g.Nodes[0].Port), 1, 0)
	const name = "Galera node 2 of 3 killed"

	r := s.EnqueueRound(t, "GA", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	atScheduled(began.Add(1500 * time.Millisecond))
	ks := killing(g.Nodes[2].Kill)
	killedAt := ks.done
	answers := <-done
	if size := g.Nodes[0].Status("wsrep_cluster_size"); size != "2" {
		t.Errorf("%s: the cluster has %q members after the results, want 2: the kill did not take", name, size)
	}
	lastAnswer := killedAt
	bad := 0
	for _, a := range answers {
		if a.End.After(lastAnswer) {
			lastAnswer = a.End
		}
		if a.Err != nil || a.Status != http.StatusOK {
			if bad++; bad <= 10 {
				t.Errorf("%s: webhook %s answered %d %q %v: with two of three nodes a 200 was due", name, a.X, a.Status, a.Body, a.Err)
			}
		}
	}
	afterKill := 0
	for _, a := range answers {
		if a.Start.After(killedAt) {
			afterKill++
		}
	}
	if afterKill == 0 {
		t.Fatalf("%s: no webhook was sent after the kill: the test did not test", name)
	}
	checkNothingHalfWritten(t, s, name, answers, ks)
	st := s.AwaitSettled(t, lastAnswer, name, func() { s.Explain(t, lastAnswer, nil) })
	s.CheckReceiver(t)

	if err := g.Nodes[2].Restart(); err != nil {
		t.Fatal(err)
	}
	awaitCaughtUp(t, g, 2, dbName)
	t.Logf("FAILOVER %s: %d results, %d sent after the kill, %d not 200; %s (from the last answer)", name, len(answers), afterKill, bad, st)
	s.StillRunning(t)
	if !t.Failed() {
		s.Stop(t)
	}
}

// galeraStack is the api on apiAddr (a node's address, or a proxy's in
// front of one) and the worker on node worker, each through its own pool,
// and the test's own view of the database on node view, all on one new
// database of g; it returns the database's name.
func galeraStack(t *testing.T, g *testha.Galera, apiAddr string, worker, view int) (*testkit.Stack, string) {
	t.Helper()
	appDSN, rootDSN := g.Nodes[0].NewDatabase(t, nil)
	on := func(dsn, addr string) (string, *mysql.Config) {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Net, cfg.Addr = "tcp", addr
		return cfg.FormatDSN(), cfg
	}
	rootDSN, _ = on(rootDSN, g.Nodes[view].Addr())
	// the test's own view reads causally too (OpenDB), or it could read
	// what its node has not applied yet
	root, err := stepmysql.OpenDB(rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	apiDSN, cfg := on(appDSN, apiAddr)
	workerDSN, _ := on(appDSN, g.Nodes[worker].Addr())
	rs := testkit.StartRedis(t)
	s := testkit.StartStack(t, testkit.StackConfig{DSN: apiDSN, RedisURL: rs.URL, DB: root, APIKey: apiKey,
		Receiver: &testkit.ReceiverOptions{CompletionsOnly: true}, WorkerArgs: []string{"-mysql-dsn", workerDSN}})
	s.Client.WithTimeout(30 * time.Second)
	return s, cfg.DBName
}

// The node the api writes through is SIGKILLed in the middle of the
// results. The api reaches the cluster as a deployment does, through a
// load balancer (here a TCP proxy) whose health check moves it to another
// node once the first stops accepting connections; the worker is on
// node 1.
//
// Galera replicates a transaction to the group before its COMMIT answers,
// so no result answered 200 may be missing from the nodes left (read back
// row by row on node 1). Webhooks in flight at the kill, and those sent
// before the balancer moved, answer 503 (or, where a COMMIT's answer was
// lost, 200 once the retry finds its evidence on the new node); every 503
// sent again is answered 200; within 15 s of the balancer's move every
// step is collected and every event delivered, each completion under one
// event id; the killed node, restarted, catches up.
func TestGaleraTheAPIsNodeKilledInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGalera(t, 3)
	node0 := fmt.Sprintf("127.0.0.1:%d", g.Nodes[0].Port)
	lb := tcpproxy.Start(t, node0)
	s, dbName := galeraStack(t, g, lb.Addr, 1, 1)
	const name = "Galera: the api's node (0 of 3) killed"

	r := s.EnqueueRound(t, "GK", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	atScheduled(began.Add(1500 * time.Millisecond))
	ks := killing(g.Nodes[0].Kill)
	killedAt := ks.done
	// the balancer's health check: a connect every 250 ms
	every(250*time.Millisecond, func() bool {
		c, err := net.DialTimeout("tcp", node0, 250*time.Millisecond)
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	lb.Retarget(fmt.Sprintf("127.0.0.1:%d", g.Nodes[2].Port))
	movedAt := time.Now()
	answers := <-done
	if size := g.Nodes[1].Status("wsrep_cluster_size"); size != "2" {
		t.Errorf("%s: the cluster has %q members after the results, want 2: the kill did not take", name, size)
	}

	tl := tallyAnswers(t, name, answers, killedAt)
	var afterMove, afterMoveBad int
	for _, a := range answers {
		if a.Start.After(movedAt.Add(time.Second)) {
			afterMove++
			if a.Status != http.StatusOK {
				if afterMoveBad++; afterMoveBad <= 10 {
					t.Errorf("%s: webhook %s sent %v after the balancer moved answered %d %q: a 200 was due",
						name, a.X, a.Start.Sub(movedAt).Round(time.Millisecond), a.Status, a.Body)
				}
			}
		}
	}
	if afterMove == 0 {
		t.Fatalf("%s: no webhook was sent a second after the balancer moved: the test did not test", name)
	}
	// before anything is sent again: every 200 committed, nothing
	// half-written, a 503 committed only if it was in flight at the kill
	checkNothingHalfWritten(t, s, name, answers, ks)
	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, movedAt)
	st := s.AwaitSettled(t, movedAt, name, func() { s.Explain(t, movedAt, nil) })
	s.CheckReceiver(t)

	if err := g.Nodes[0].Restart(); err != nil {
		t.Fatal(err)
	}
	awaitCaughtUp(t, g, 0, dbName)
	t.Logf("FAILOVER %s: %s; the balancer moved %v after the kill, the first 200 sent after the kill came %s after it; "+
		"%d sent again in %d rounds; %s (from the move)",
		name, tl, movedAt.Sub(killedAt).Round(time.Millisecond), tl.first(killedAt), resent, rounds, st)
	finish(t, s)
}

// The whole cluster is lost at once in the middle of the results (every
// node SIGKILLed, as a power cut does) and started again as its operator
// must: the most advanced node bootstraps, the others join it. The api is
// on node 0, the worker on node 1.
//
// Every webhook answers 200 or 503 (none hangs, none is refused as bad
// input); every 200 is committed once the cluster is back, none
// half-written (a 503 in flight at the kill may be committed); the 503s
// sent again are answered 200; within 15 s of the cluster answering again
// every step is collected and every event delivered.
func TestGaleraWholeClusterRestartedInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGalera(t, 3)
	s, _ := galeraStack(t, g, fmt.Sprintf("127.0.0.1:%d", g.Nodes[0].Port), 1, 1)
	wholeRestartRound(t, s, "Galera: the whole cluster killed and restarted", g, 60*time.Second,
		restartWords{whole: "cluster", one: "node", back: "Synced"})
}

// restartWords name a cluster's parts in a whole-restart round's messages.
type restartWords struct{ whole, one, back string }

// wholeRestartRound kills every server of c in the middle of a fan-out
// through s, restarts them (within the bound), and checks what the
// whole-restart tests promise: some webhook answered 503 while c was down,
// every 200 is committed and none half-written, the 503s sent again are
// answered 200, and everything settles within 15 s of c being back.
func wholeRestartRound(t *testing.T, s *testkit.Stack, name string, c interface {
	KillAll()
	RestartAll(within time.Duration) (int, error)
}, within time.Duration, w restartWords) {
	t.Helper()
	s.Client.WithTimeout(60 * time.Second)
	r := s.EnqueueRound(t, "GW", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	atScheduled(began.Add(1500 * time.Millisecond))
	ks := killing(c.KillAll)
	killedAt := ks.done
	boot, err := c.RestartAll(within)
	if err != nil {
		t.Fatal(err)
	}
	backAt := time.Now()
	answers := <-done

	tl := tallyAnswers(t, name, answers, killedAt)
	if tl.unavailable == 0 {
		t.Errorf("%s: no webhook answered 503: none was sent while the %s was down, the test did not test", name, w.whole)
	}
	checkNothingHalfWritten(t, s, name, answers, ks)
	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, backAt)
	st := s.AwaitSettled(t, backAt, name, func() { s.Explain(t, backAt, nil) })
	s.CheckReceiver(t)
	t.Logf("FAILOVER %s: %s; from the kill until every %s was %s again %v (%s %d bootstrapped), "+
		"the first 200 of a webhook sent after the kill %s after it; %d sent again in %d rounds; %s (from the %s back)",
		name, tl, w.one, w.back, backAt.Sub(killedAt).Round(time.Millisecond), w.one, boot, tl.first(killedAt), resent, rounds, st, w.whole)
	finish(t, s)
}

// Two of three nodes SIGKILLed in the middle of the results: the node left,
// which the api and the worker use, has no quorum. Galera makes it refuse
// writes (1047) once it knows, and the api must answer 503 for them, never
// anything else, and its /readyz must say so (503 naming mysql), so that a
// load balancer moves off it. The operator then makes the node a primary
// component on its own (pc.bootstrap), writes are answered 200 again and
// /readyz 200, and the two killed nodes, restarted, join it.
//
// Every 200 is committed, none half-written (a 503 in flight at the kill
// may be), the 503s sent again are answered 200, and within 15 s of the
// bootstrap every step is collected and every event delivered.
func TestGaleraNodeWithoutQuorum(t *testing.T) {
	g := testha.StartGalera(t, 3)
	s, _ := galeraStack(t, g, fmt.Sprintf("127.0.0.1:%d", g.Nodes[0].Port), 0, 0)
	s.Client.WithTimeout(60 * time.Second)
	const name = "Galera: 2 of 3 nodes killed, the api's node without quorum"
	ready := func() int {
		resp, err := http.Get(s.APIURL + "/readyz")
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := ready(); code != http.StatusOK {
		t.Fatalf("%s: /readyz answered %d before the kill", name, code)
	}

	r := s.EnqueueRound(t, "GQ", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 11*time.Second, 32)
	atScheduled(began.Add(1500 * time.Millisecond))
	ks := killing(func() { g.Nodes[1].Kill(); g.Nodes[2].Kill() })
	killedAt := ks.done
	testkit.WaitUntil(t, 30*time.Second, "node 0 out of the primary component", func() (bool, any) {
		st := g.Nodes[0].Status("wsrep_cluster_status")
		return st != "" && st != "Primary", st
	})
	nonPrimaryAt := time.Now()
	testkit.WaitUntil(t, 15*time.Second, "the api's /readyz 503", func() (bool, any) {
		code := ready()
		return code == http.StatusServiceUnavailable, code
	})
	notReadyAt := time.Now()
	// the operator's decision, 2 s on: this node alone is the cluster now
	atScheduled(nonPrimaryAt.Add(2 * time.Second))
	if _, err := g.Nodes[0].Admin.Exec("SET GLOBAL wsrep_provider_options = 'pc.bootstrap=YES'"); err != nil {
		t.Fatal(err)
	}
	bootAt := time.Now()
	testkit.WaitUntil(t, 15*time.Second, "the api's /readyz 200 again", func() (bool, any) {
		code := ready()
		return code == http.StatusOK, code
	})
	readyAgainAt := time.Now()
	answers := <-done

	tl := tallyAnswers(t, name, answers, killedAt)
	var refused int
	var lastOK time.Time // of a webhook sent after the kill, before the bootstrap
	var refusedTook []time.Duration
	for _, a := range answers {
		if a.Start.After(nonPrimaryAt.Add(100*time.Millisecond)) && a.End.Before(bootAt) {
			// sent to the node once it knew it had no quorum
			refused++
			refusedTook = append(refusedTook, a.Took())
			if a.Status != http.StatusServiceUnavailable || a.Took() > quick503 {
				t.Errorf("%s: webhook %s sent to the node without quorum answered %d after %v: a 503 within %v was due",
					name, a.X, a.Status, a.Took().Round(time.Millisecond), quick503)
			}
		}
		if a.Status == http.StatusOK && a.Start.After(killedAt) && a.End.Before(bootAt) && a.End.After(lastOK) {
			lastOK = a.End
		}
	}
	if refused == 0 {
		t.Errorf("%s: no webhook was sent and answered while the node knew it had no quorum: the test did not test", name)
	}
	checkNothingHalfWritten(t, s, name, answers, ks)
	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, bootAt)
	st := s.AwaitSettled(t, bootAt, name, func() { s.Explain(t, bootAt, nil) })
	s.CheckReceiver(t)
	for _, i := range []int{1, 2} {
		if err := g.Nodes[i].Restart(); err != nil {
			t.Fatal(err)
		}
	}
	testkit.WaitUntil(t, 60*time.Second, "the killed nodes joined again", func() (bool, any) {
		size := g.Nodes[0].Status("wsrep_cluster_size")
		return size == "3", size
	})
	last := "none"
	if !lastOK.IsZero() {
		last = lastOK.Sub(killedAt).Round(time.Millisecond).String()
	}
	t.Logf("FAILOVER %s: %s; node 0 non-Primary %v after the kill (writes held until then; the last 200 of a webhook sent after the kill: %s), /readyz 503 %v after that; "+
		"%d sent while it knew, all 503 (p50 %v, slowest %v); bootstrapped %v after the kill, /readyz 200 %v after that; %d sent again in %d rounds; %s (from the bootstrap)",
		name, tl, nonPrimaryAt.Sub(killedAt).Round(time.Millisecond), last, notReadyAt.Sub(nonPrimaryAt).Round(time.Millisecond),
		refused, percentile(refusedTook, 50).Round(time.Millisecond), percentile(refusedTook, 100).Round(time.Millisecond),
		bootAt.Sub(killedAt).Round(time.Millisecond), readyAgainAt.Sub(bootAt).Round(time.Millisecond), resent, rounds, st)
	finish(t, s)
}

// finish logs the processes' counters, checks they still run, and stops
// them when the test passed (a failed test's logs show what they did).
func finish(t *testing.T, s *testkit.Stack) {
	t.Helper()
	s.LogMetrics(t)
	s.StillRunning(t)
	if !t.Failed() {
		s.Stop(t)
	}
}

// The node the api writes through freezes in the middle of the results
// (SIGSTOP, as a paused VM or a stalled host does): its connections stay
// open and nothing answers on them, so the api's transactions on it wait
// in silence rather than fail, which is how a node cut off the network
// looks to its clients. The balancer in front checks each node with a
// MySQL ping bounded at 1 s, as HAProxy's mysql-check does (a TCP connect
// alone succeeds on a frozen server: the kernel accepts it), moves to node
// 2 and closes the sessions it had sent to node 0. The two nodes left
// evict node 0 after evs.suspect_timeout and keep the quorum.
//
// Every webhook answers 200 or 503 within the client's 60 s (a try on the
// frozen node is given up after -mysql-try-timeout, 10 s, and run again
// through the balancer); every 200 is committed (read back row by row on
// node 1), none half-written; the 503s sent again are answered 200; within
// 15 s of the move every step is collected and every event delivered; node
// 0, thawed, finds itself evicted, rejoins and catches up.
func TestGaleraTheAPIsNodeFrozenInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGalera(t, 3)
	t.Cleanup(g.Nodes[0].Thaw) // a frozen process ignores the SIGKILL's wait otherwise
	silentNodeRound(t, g, "Galera: the api's node (0 of 3) frozen", "GF", g.Nodes[0].Admin,
		func() error { g.Nodes[0].Freeze(); return nil },
		func() error { g.Nodes[0].Thaw(); return nil }, nil)
}

// The host of the node the api writes through is cut off the network in
// the middle of the results: every packet to and from it dropped, its
// connections silent (each node in a network namespace of its own,
// testha.StartGaleraOnNetwork). The balancer in front checks each node
// with a MySQL ping over the network bounded at 1 s, moves to node 2 and
// closes the sessions it had sent to node 0. The two nodes left evict node
// 0 after evs.suspect_timeout and keep the quorum; node 0, alone, leaves
// the primary component.
//
// Every webhook answers 200 or 503 within the client's 60 s; every 200 is
// committed (read back row by row on node 1), none half-written; the 503s
// sent again are answered 200; within 15 s of the move every step is
// collected and every event delivered; node 0, healed, rejoins the
// cluster by itself and catches up.
func TestGaleraTheAPIsNodeCutOffInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGaleraOnNetwork(t, 3)
	// the balancer's check goes over the network: the test's own pool is
	// on the socket, which the cut leaves reachable
	check := mysql.NewConfig()
	check.User, check.Net, check.Addr = "root", "tcp", g.Nodes[0].Addr()
	check.Timeout, check.ReadTimeout = time.Second, time.Second
	probe, err := sql.Open("mysql", check.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	probe.SetMaxIdleConns(0) // a connection of its own for each check, as a balancer's
	if err := probe.Ping(); err != nil {
		t.Fatalf("the balancer's check of node 0 before the cut: %v", err)
	}
	host := g.Network.Hosts()[0]
	silentNodeRound(t, g, "Galera: the api's node (0 of 3) cut off the network", "GC", probe, host.Cut, host.Heal, func() {
		// alone, it knows it has no quorum (asked on its socket)
		testkit.WaitUntil(t, 30*time.Second, "node 0, cut off, out of the primary component", func() (bool, any) {
			st := g.Nodes[0].Status("wsrep_cluster_status")
			return st != "" && st != "Primary", st
		})
	})
}

// silentNodeRound is the body of the tests above: the api through a
// balancer on node 0, the worker and the test's view on node 1; node 0
// silenced 1.5 s into the results; the balancer's check (a ping on probe
// every 250 ms, bounded at 1 s) failing, it moves to node 2 and closes the
// sessions it had sent to node 0; then what the tests promise is checked,
// whileSilent (if any) runs, node 0 is restored, and it must catch up.
func silentNodeRound(t *testing.T, g *testha.Galera, name, prefix string, probe *sql.DB, silence, restore func() error, whileSilent func()) {
	t.Helper()
	lb := tcpproxy.Start(t, g.Nodes[0].Addr())
	s, dbName := galeraStack(t, g, lb.Addr, 1, 1)
	s.Client.WithTimeout(60 * time.Second)

	r := s.EnqueueRound(t, prefix, enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	atScheduled(began.Add(1500 * time.Millisecond))
	var silenceErr error
	ks := killing(func() { silenceErr = silence() })
	if silenceErr != nil {
		t.Fatal(silenceErr)
	}
	silencedAt := ks.done
	// the balancer's health check: a ping every 250 ms
	every(250*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		return probe.PingContext(ctx) != nil
	})
	lb.Move(g.Nodes[2].Addr())
	movedAt := time.Now()
	answers := <-done
	testkit.WaitUntil(t, 30*time.Second, "node 1 in a cluster of two, node 0 evicted", func() (bool, any) {
		size := g.Nodes[1].Status("wsrep_cluster_size")
		return size == "2", size
	})

	tl := tallyAnswers(t, name, answers, silencedAt)
	checkNothingHalfWritten(t, s, name, answers, ks)
	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, movedAt)
	st := s.AwaitSettled(t, movedAt, name, func() { s.Explain(t, movedAt, nil) })
	s.CheckReceiver(t)
	if whileSilent != nil {
		whileSilent()
	}

	if err := restore(); err != nil {
		t.Fatal(err)
	}
	back := awaitCaughtUp(t, g, 0, dbName)
	t.Logf("FAILOVER %s: %s, the slowest answered after %v; the balancer moved %v after the fault, the first 200 sent after it came %s after it; "+
		"%d sent again in %d rounds; %s (from the move); restored, node 0 Synced again after %v",
		name, tl, tl.slowest.Round(time.Millisecond), movedAt.Sub(silencedAt).Round(time.Millisecond), tl.first(silencedAt),
		resent, rounds, st, back.Round(time.Millisecond))
	finish(t, s)
}

// awaitCaughtUp waits until node i, restarted, thawed or healed, is
// Synced in a cluster of every node again and holds no step row of
// dbName, and returns how long that took.
func awaitCaughtUp(t *testing.T, g *testha.Galera, i int, dbName string) time.Duration {
	t.Helper()
	other := (i + 1) % len(g.Nodes)
	return testkit.WaitUntil(t, 90*time.Second, fmt.Sprintf("node %d back in the cluster, caught up, without step rows", i), func() (bool, any) {
		state := g.Nodes[i].Status("wsrep_local_state_comment")
		size := g.Nodes[other].Status("wsrep_cluster_size")
		var steps int
		err := g.Nodes[i].Admin.QueryRow("SELECT COUNT(*) FROM " + dbName + ".steps").Scan(&steps)
		return state == "Synced" && size == strconv.Itoa(len(g.Nodes)) && err == nil && steps == 0,
			fmt.Sprintf("%s, cluster size %s, %d steps, %v", state, size, steps, err)
	})
}
