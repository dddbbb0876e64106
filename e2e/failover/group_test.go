package failover

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
)

// groupStack is the api and the worker, unchanged, both through g's
// Balancer (see testha.Group for why not MySQL Router), and the test's own
// view of the database on member view (as root, on its socket), all on
// one new database of g's primary (member 0); it returns the database's
// name and the DSN the api and the worker use.
func groupStack(t *testing.T, g *testha.Group, view int) (s *testkit.Stack, dbName, appDSN string) {
	t.Helper()
	appDSN, _ = g.Members[0].NewDatabase(t, nil)
	cfg, err := mysql.ParseDSN(appDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = g.Balancer.Addr
	rootCfg, err := mysql.ParseDSN(g.Members[view].DSN())
	if err != nil {
		t.Fatal(err)
	}
	rootCfg.DBName, rootCfg.ParseTime = cfg.DBName, true
	root, err := sql.Open("mysql", rootCfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	s = startStack(t, cfg.FormatDSN(), testkit.StartRedis(t).URL, root)
	s.Client.WithTimeout(30 * time.Second)
	return s, cfg.DBName, cfg.FormatDSN()
}

// The primary of a three-member Group Replication group in single-primary
// mode is SIGKILLed in the middle of the results. The api and the worker
// reach the group through a balancer whose health check follows the
// primary; the members left elect member 1, and the balancer moves to it.
//
// A transaction commits on the primary once a majority of the group has
// it, so no result answered 200 may be missing from the new primary (read
// back row by row on member 1). Until the election no member takes writes:
// the balancer still points at the dead primary (connections refused) and
// the secondaries refuse writes (super_read_only, 1290); those webhooks
// answer 503, as does one in flight at the kill (or 200, where a
// COMMIT's answer was lost and the retry finds its evidence). Every 503
// sent again is answered 200; within 15 s of the election every step is
// collected and every event delivered, each completion under one event
// id; the killed member, rejoined, has caught up and holds no step row.
func TestGroupReplicationPrimaryKilledInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGroupReplication(t, testha.GroupConfig{})
	s, dbName, dsn := groupStack(t, g, 1)
	const name = "Group Replication: the primary (member 0 of 3) killed, behind a health-checked balancer"

	r := s.EnqueueRound(t, "GR", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	atScheduled(began.Add(1500 * time.Millisecond))
	ks := killing(g.Members[0].Kill)
	killedAt := ks.done
	testkit.WaitUntil(t, 60*time.Second, "member 1 elected primary", func() (bool, any) {
		p := g.Primary(1)
		return p == 1, p
	})
	electedAt := time.Now()
	answers := <-done

	tl := tallyAnswers(t, name, answers, killedAt)
	if tl.unavailable == 0 {
		t.Errorf("%s: no webhook answered 503: none was sent before the election, the test did not test", name)
	}
	// before anything is sent again: every 200 committed, nothing
	// half-written, a 503 committed only if it was in flight at the kill
	checkNothingHalfWritten(t, s, name, answers, ks)
	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, electedAt)
	st := s.AwaitSettled(t, electedAt, name, func() { s.Explain(t, electedAt, nil) })
	s.CheckReceiver(t)
	if err := g.Rejoin(0, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	testkit.WaitUntil(t, 60*time.Second, "the rejoined member caught up, without step rows", func() (bool, any) {
		var steps int
		err := g.Members[0].Admin.QueryRow("SELECT COUNT(*) FROM " + dbName + ".steps").Scan(&steps)
		return err == nil && steps == 0, fmt.Sprintf("%d steps, %v", steps, err)
	})
	if p := g.Primary(0); p != 1 {
		t.Errorf("%s: after member 0 rejoined it sees member %d as the primary, want 1", name, p)
	}
	// the balancer does not go back to the rejoined member (a secondary
	// now): a new connection through it is on member 1
	via, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer via.Close()
	var port int
	if err := via.QueryRow("SELECT @@port").Scan(&port); err != nil || port != g.Members[1].Port {
		t.Errorf("%s: a new connection through the balancer after member 0 rejoined is on port %d (%v), want member 1's %d", name, port, err, g.Members[1].Port)
	}
	t.Logf("FAILOVER %s: %s; member 1 elected %v after the kill (writes refused until then), the first 200 sent after the kill %s after it; "+
		"%d sent again in %d rounds; %s (from the election)",
		name, tl, electedAt.Sub(killedAt).Round(time.Millisecond), tl.first(killedAt), resent, rounds, st)
	finish(t, s)
}

// The primary's host is cut off the network in the middle of the results:
// every packet to and from it dropped, so connections to it go silent
// rather than fail. The group runs with group_replication_member_expel_timeout
// 0, which docs/operations.md gives for a fast failover (the kill test
// above keeps the default). The two members left elect member 1. The api
// and the worker reach the group through the balancer, whose health check
// moves to it and closes the sessions it forwarded to member 0.
//
// The cut-off primary can commit nothing without the majority, so no
// result answered 200 may be missing on member 1 (read back row by row).
// Webhooks whose transactions were on member 0 when it was cut must not
// hang: they answer 503 within the webhook's bound (or 200, where the
// commit's evidence is found on the new primary). Every 503 sent again is
// answered 200; within 15 s of the election every step is collected and
// every event delivered; healed, member 0 rejoins by itself as a
// secondary and holds no step row.
func TestGroupReplicationPrimaryPartitionedAwayInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGroupReplication(t, testha.GroupConfig{Partitionable: true,
		Args: []string{"--group-replication-member-expel-timeout=0"}})
	s, dbName, _ := groupStack(t, g, 1)
	s.Client.WithTimeout(60 * time.Second)
	const name = "Group Replication: the primary's host (member 0 of 3) cut off the network, behind a health-checked balancer"

	r := s.EnqueueRound(t, "GP", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	atScheduled(began.Add(1500 * time.Millisecond))
	var cutErr error
	ks := killing(func() { cutErr = g.Members[0].Host().Cut() })
	if cutErr != nil {
		t.Fatal(cutErr)
	}
	cutAt := ks.done
	testkit.WaitUntil(t, 60*time.Second, "member 1 elected primary", func() (bool, any) {
		p := g.Primary(1)
		return p == 1, p
	})
	electedAt := time.Now()
	answers := <-done

	tl := tallyAnswers(t, name, answers, cutAt)
	checkNothingHalfWritten(t, s, name, answers, ks)
	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, electedAt)
	st := s.AwaitSettled(t, electedAt, name, func() { s.Explain(t, electedAt, nil) })
	s.CheckReceiver(t)

	if err := g.Members[0].Host().Heal(); err != nil {
		t.Fatal(err)
	}
	healedAt := time.Now()
	if err := g.AwaitOnline(3, 1, 120*time.Second); err != nil {
		t.Fatal(err)
	}
	rejoined := time.Since(healedAt)
	testkit.WaitUntil(t, 60*time.Second, "the healed member caught up, without step rows", func() (bool, any) {
		var steps int
		err := g.Members[0].Admin.QueryRow("SELECT COUNT(*) FROM " + dbName + ".steps").Scan(&steps)
		return err == nil && steps == 0, fmt.Sprintf("%d steps, %v", steps, err)
	})
	t.Logf("FAILOVER %s: %s, the slowest answered after %v; member 1 elected %v after the cut, the first 200 sent after the cut %s after it; "+
		"%d sent again in %d rounds; %s (from the election); healed, member 0 ONLINE again after %v",
		name, tl, tl.slowest.Round(time.Millisecond), electedAt.Sub(cutAt).Round(time.Millisecond), tl.first(cutAt), resent, rounds, st, rejoined.Round(time.Millisecond))
	finish(t, s)
}

// The whole group is lost at once in the middle of the results (every
// member SIGKILLed, as a power cut does) and rebooted as its operator
// must: every member started, the one holding every transaction any
// member has bootstraps the group, the others join it
// (testha.Group.RestartAll). The api and the worker are behind the
// balancer.
//
// Every webhook answers 200 or 503 (none hangs, none is refused as bad
// input); every 200 is committed once the group is back, none
// half-written (a 503 in flight at the kill may be committed); the 503s
// sent again are answered 200; within 15 s of the group being ONLINE
// again every step is collected and every event delivered.
func TestGroupReplicationWholeGroupRestartedInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGroupReplication(t, testha.GroupConfig{})
	s, _, _ := groupStack(t, g, 1)
	wholeRestartRound(t, s, "Group Replication: the whole group killed and rebooted", g, 90*time.Second,
		restartWords{whole: "group", one: "member", back: "ONLINE"})
}
