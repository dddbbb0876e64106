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

// groupStack is the api and the worker, unchanged, both through MySQL
// Router in front of g, and the test's own view of the database on member
// view (as root, on its socket), all on one new database of g's primary
// (member 0); it returns the database's name and the DSN the api and the
// worker use.
func groupStack(t *testing.T, g *testha.Group, view int) (s *testkit.Stack, dbName, appDSN string) {
	t.Helper()
	appDSN, _ = g.Members[0].NewDatabase(t, nil)
	cfg, err := mysql.ParseDSN(appDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = g.Router.Addr()
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
// reach the group through MySQL Router; the members left elect member 1,
// and Router moves to it (see testha.Group for how Router's static list
// follows the election).
//
// A transaction commits on the primary once a majority of the group has
// it, so no result answered 200 may be missing from the new primary (read
// back row by row on member 1). Until the election, Router's next member
// is a secondary, which refuses writes (super_read_only, 1290): those
// webhooks answer 503, as does one in flight at the kill (or 200, where a
// COMMIT's answer was lost and the retry finds its evidence). Every 503
// sent again is answered 200; within 15 s of the election every step is
// collected and every event delivered, each completion under one event
// id; the killed member, rejoined, has caught up and holds no step row.
func TestGroupReplicationPrimaryKilledInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGroupReplication(t, 3)
	s, dbName, dsn := groupStack(t, g, 1)
	const name = "Group Replication: the primary (member 0 of 3) killed, behind MySQL Router"

	r := s.EnqueueRound(t, "GR", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	time.Sleep(time.Until(began.Add(1500 * time.Millisecond)))
	g.Members[0].Kill()
	killedAt := time.Now()
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
	checkNothingHalfWritten(t, s, name, answers, killedAt)
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
	// Router does not go back to the rejoined member (a secondary now):
	// a new connection through it is on member 1
	via, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer via.Close()
	var port int
	if err := via.QueryRow("SELECT @@port").Scan(&port); err != nil || port != g.Members[1].Port {
		t.Errorf("%s: a new connection through Router after member 0 rejoined is on port %d (%v), want member 1's %d", name, port, err, g.Members[1].Port)
	}
	t.Logf("FAILOVER %s: %s; member 1 elected %v after the kill (writes refused until then), the first 200 sent after the kill %s after it; "+
		"%d sent again in %d rounds; %s (from the election)",
		name, tl, electedAt.Sub(killedAt).Round(time.Millisecond), tl.first(killedAt), resent, rounds, st)
	finish(t, s)
}
