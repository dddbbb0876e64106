package failover

import (
	"database/sql"
	"fmt"
	"net/http"
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
	time.Sleep(time.Until(began.Add(before)))
	ks := killing(srv.Kill)
	killedAt := ks.done
	time.Sleep(time.Until(killedAt.Add(down)))
	restartIssued := time.Now()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	upAt := time.Now()
	doneAfter := s.Stream(results[k:], after, 32)
	answers := append(<-done, <-doneAfter...)

	var ok, unavailable, inside, insideOK, afterUp, afterUpBad int
	var took503 []time.Duration
	var firstOKAfterUp time.Time
	var again []testkit.Result
	bad := func(format string, args ...any) {
		if afterUpBad+insideOK < 10 {
			t.Errorf(name+": "+format, args...)
		}
	}
	for _, a := range answers {
		switch {
		case a.Err == nil && a.Status == http.StatusOK:
			ok++
		case a.Err == nil && a.Status == http.StatusServiceUnavailable:
			unavailable++
			took503 = append(took503, a.Took())
			again = append(again, a.X)
			if a.Took() > quick503 {
				t.Errorf("%s: webhook %s answered 503 after %v, not within %v", name, a.X, a.Took().Round(time.Millisecond), quick503)
			}
		default:
			t.Errorf("%s: webhook %s answered %d %q %v: only 200 or 503 are right", name, a.X, a.Status, a.Body, a.Err)
		}
		if a.Start.After(killedAt) && a.End.Before(restartIssued) {
			inside++
			if a.Status != http.StatusServiceUnavailable {
				insideOK++
				bad("webhook %s sent %v after the kill and answered %d before the restart: a 503 was due",
					a.X, a.Start.Sub(killedAt).Round(time.Millisecond), a.Status)
			}
		}
		if a.Start.After(upAt) {
			afterUp++
			if a.Status != http.StatusOK {
				afterUpBad++
				bad("webhook %s sent %v after the server answered again answered %d %q: a 200 was due",
					a.X, a.Start.Sub(upAt).Round(time.Millisecond), a.Status, a.Body)
			} else if firstOKAfterUp.IsZero() || a.End.Before(firstOKAfterUp) {
				firstOKAfterUp = a.End
			}
		}
	}
	if inside == 0 {
		t.Errorf("%s: no webhook was sent and answered while the server was down: the test did not test", name)
	}
	if afterUp == 0 {
		t.Errorf("%s: no webhook was sent after the server answered again (its start took %v): the test did not test recovery",
			name, upAt.Sub(restartIssued).Round(time.Millisecond))
	}

	// Before anything is sent again: every 200 survived the crash, nothing
	// half-written anywhere.
	checkNothingHalfWritten(t, s, name, answers, ks)

	// the 503 ones again, as the enrollments must end up done
	resent, rounds := len(again), 0
	for len(again) > 0 && time.Since(upAt) < bound {
		if rounds > 0 {
			time.Sleep(100 * time.Millisecond)
		}
		rounds++
		var still []testkit.Result
		for _, x := range again {
			if a := s.Send(x); a.Err != nil || a.Status != http.StatusOK {
				still = append(still, x)
			}
		}
		again = still
	}
	if len(again) > 0 {
		t.Errorf("%s: %d results still not answered 200 %v after the server answered again", name, len(again), bound)
	}
	st := s.AwaitSettled(t, upAt, name, func() { s.Explain(t, upAt, nil) })
	s.CheckReceiver(t)

	t.Logf("FAILOVER %s: %d results over %v, killed %v in, down %v, its start (crash recovery) %v: %d answered 200, %d answered 503 (p50 %v, p99 %v, slowest %v); "+
		"%d sent and answered while it was down, %d of them not 503",
		name, len(answers), upAt.Add(after).Sub(began).Round(time.Millisecond), killedAt.Sub(began).Round(time.Millisecond), restartIssued.Sub(killedAt).Round(time.Millisecond),
		upAt.Sub(restartIssued).Round(time.Millisecond), ok, unavailable,
		percentile(took503, 50).Round(time.Millisecond), percentile(took503, 99).Round(time.Millisecond), percentile(took503, 100).Round(time.Millisecond),
		inside, insideOK)
	firstOK := "none"
	if !firstOKAfterUp.IsZero() {
		firstOK = firstOKAfterUp.Sub(upAt).Round(time.Millisecond).String()
	}
	t.Logf("FAILOVER %s: after the server answered again: %d sent, %d not 200, the first 200 %v after; %d answered 503 sent again in %d rounds; %s (from the server answering)",
		name, afterUp, afterUpBad, firstOK, resent, rounds, st)
	s.LogMetrics(t)
	s.LogDigest(t, began, killedAt, true)
	s.StillRunning(t)
	if !t.Failed() {
		s.Stop(t)
	}
}
