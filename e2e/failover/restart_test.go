package failover

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
)

// MySQL killed in the middle of the results (SIGKILL, as a crash or an OOM
// kill does: no goodbye to its clients) and started again three seconds
// later on the same port and datadir, on a private server of the suite's
// kind (testha.StartSQLServer); the restart includes InnoDB's crash
// recovery (and, on MySQL, the binary log's: it is on, with sync_binlog=1).
// The binaries connect as in readonly_test.go.
//
// Every webhook answers 200 or 503, each 503 within quick503; every one
// sent after the kill and answered before the restart began answers 503
// (nothing can commit it); every result answered 200 is committed, so
// still there after the crash recovery; every one answered 503 left its
// rows as they were, except one in flight at the kill, whose COMMIT may
// have reached the server. Once the server answers again every result
// answers 200 without a restart of the binaries, the 503 ones sent again
// answer 200, and within 15 s of the server answering every step is
// collected and every event delivered, each completion under one event id.
func TestMySQLKilledAndRestarted(t *testing.T) {
	srv := testha.StartSQLServer(t)
	appDSN, rootDSN := srv.NewDatabase(t, nil)
	root, err := sql.Open("mysql", rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	rs := testkit.StartRedis(t)
	s := startStack(t, appDSN, rs.URL, root)
	name := fmt.Sprintf("%s killed and restarted", srv.Kind)

	r := s.EnqueueRound(t, "RS", enrollments())
	// Three quarters of the results over the time before the kill, the
	// downtime and a while into the start (MySQL's takes about 5 s here,
	// MariaDB's under one), the rest once the server answers again, however
	// long its start took: recovery is tested every time.
	const before, down, starting, after = 2 * time.Second, 3 * time.Second, 3 * time.Second, 2 * time.Second
	results := r.Results()
	k := len(results) * 3 / 4
	began := time.Now()
	done := s.Stream(results[:k], before+down+starting, 32)
	// the fault's own schedule, not a wait for a condition
	atScheduled(began.Add(before))
	ks := killing(srv.Kill)
	killedAt := ks.done
	atScheduled(killedAt.Add(down))
	restartIssued := time.Now()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	upAt := time.Now()
	doneAfter := s.Stream(results[k:], after, 32)
	answers := append(<-done, <-doneAfter...)

	tl := tallyAnswers(t, name, answers, upAt) // its first: the first 200 once writes were back
	o := outage{began: killedAt, ending: restartIssued, back: upAt, during: "the server was down",
		beganAs: "the kill", endingAs: "the restart", backAs: "the server answered again"}
	seen := checkOutage(t, name, answers, o)

	// Before anything is sent again: every 200 survived the crash, nothing
	// half-written anywhere.
	checkNothingHalfWritten(t, s, name, answers, ks)

	// the 503 ones again, as the enrollments must end up done
	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, upAt)
	st := s.AwaitSettled(t, upAt, name, func() { s.Explain(t, upAt, nil) })
	s.CheckReceiver(t)

	t.Logf("FAILOVER %s: results sent over %v, killed %v in, down %v, its start (crash recovery) %v: %s (503s: %s); "+
		"%d sent and answered while it was down, %d of them not 503",
		name, upAt.Add(after).Sub(began).Round(time.Millisecond), killedAt.Sub(began).Round(time.Millisecond), restartIssued.Sub(killedAt).Round(time.Millisecond),
		upAt.Sub(restartIssued).Round(time.Millisecond), tl, tl.took503s(), seen.inside, seen.insideBad)
	t.Logf("FAILOVER %s: after the server answered again: %d sent, %d not 200, the first 200 %v after; %d answered 503 sent again in %d rounds; %s (from the server answering)",
		name, seen.afterBack, seen.afterBackBad, tl.first(upAt), resent, rounds, st)
	s.LogDigest(t, began, killedAt, true)
	finish(t, s)
}
