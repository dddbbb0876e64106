package failover

import (
	"database/sql"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
)

// quick503 is how soon a webhook that cannot be committed must be answered
// 503: far inside the webhook client's timeout (30 s here; NanoMDM sends
// the webhook inside the device's own check-in request, which waits for
// it), so that neither is held up. Measured: 1-2 ms with the DSN as it is;
// about 1 s with rejectReadOnly=true, where every refusal ends the
// connection and the storage tries ten times (up to 1.6 s of backoff)
// before it answers. The bound leaves that retry loop room on a loaded
// machine.
const quick503 = 3 * time.Second

// MySQL refusing writes for a while, as a managed MySQL or MariaDB does to
// the old primary while it fails over: the server made read-only for four
// seconds in the middle of the results, on a private server of the suite's
// kind (testha.StartSQLServer: mariadbd under `make test`, MySQL 9.7's
// mysqld under `make test-mysql`; the shared server's globals are not the
// test's to change). On MariaDB that is GLOBAL read_only; on MySQL
// super_read_only, as MySQL's failover tooling sets it (read_only alone
// lets SUPER and CONNECTION_ADMIN write). The binaries connect as an
// ordinary user with every privilege on their database and none on the
// server: either refuses its writes with error 1290 (MariaDB 10.11 lets a
// user with READ_ONLY ADMIN, such as root, write through read_only).
//
// Every webhook sent and answered while the server is read-only answers
// 503, each within quick503; nothing is written for them (their
// id_commands row untouched, no event), and every result answered 200 is
// committed (its row gone, its event in the outbox or delivered). Once
// writes return, every result answers 200 again without a restart, the 503
// ones sent again (NanoMDM would not; every enrollment must end up done)
// answer 200, and within 15 s of read-only going off every step is
// collected and every event delivered, each completion under one event id.
//
// It runs twice: with the DSN as it is, and with rejectReadOnly=true, as
// docs/operations.md's "MySQL high availability" recommends for DNS-based failovers.
func TestMySQLRefusesWritesForAWhile(t *testing.T) {
	mdb := testha.StartSQLServer(t)
	for _, c := range []struct {
		name   string
		reject bool
	}{{"plain_dsn", false}, {"rejectReadOnly", true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Cleanup(func() {
				if err := mdb.SetReadOnly(false); err != nil {
					t.Errorf("read-only off: %v", err)
				}
			})
			readOnlyRound(t, mdb, c.reject)
		})
	}
}

func readOnlyRound(t *testing.T, mdb *testha.SQLServer, rejectReadOnly bool) {
	appDSN, rootDSN := mdb.NewDatabase(t, func(c *mysql.Config) { c.RejectReadOnly = rejectReadOnly })
	root, err := sql.Open("mysql", rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	rs := testkit.StartRedis(t)
	s := startStack(t, appDSN, rs.URL, root)
	name := fmt.Sprintf("%s read-only (rejectReadOnly=%v)", mdb.Kind, rejectReadOnly)

	r := s.EnqueueRound(t, "RO", enrollments())
	const before, during, after = 2 * time.Second, 4 * time.Second, 2 * time.Second
	began := time.Now()
	done := s.Stream(r.Results(), before+during+after, 32)
	// the fault's own schedule, not a wait for a condition
	atScheduled(began.Add(before))
	if err := mdb.SetReadOnly(true); err != nil {
		t.Fatal(err)
	}
	onAt := time.Now()
	atScheduled(onAt.Add(during))
	offIssued := time.Now()
	if err := mdb.SetReadOnly(false); err != nil {
		t.Fatal(err)
	}
	offAt := time.Now()
	answers := <-done

	tl := tallyAnswers(t, name, answers, offAt) // its first: the first 200 once writes were back
	o := outage{began: onAt, ending: offIssued, back: offAt, during: "read-only was on",
		beganAs: "read-only went on", endingAs: "it went off", backAs: "read-only went off"}
	seen := checkOutage(t, name, answers, o)

	// Before anything is sent again: every 200 committed, nothing written
	// for a 503, nothing half-written anywhere.
	checkNothingHalfWritten(t, s, name, answers, killSpan{})

	resent, rounds := len(tl.again), sendAgain(t, s, name, tl.again, offAt)
	st := s.AwaitSettled(t, offAt, name, func() { s.Explain(t, offAt, nil) })
	s.CheckReceiver(t)

	t.Logf("FAILOVER %s: results sent over %v, read-only on %v in for %v: %s (503s: %s); "+
		"%d sent and answered inside the window, %d of them not 503",
		name, before+during+after, onAt.Sub(began).Round(time.Millisecond), offAt.Sub(onAt).Round(time.Millisecond),
		tl, tl.took503s(), seen.inside, seen.insideBad)
	t.Logf("FAILOVER %s: after read-only went off: %d sent, %d not 200, the first 200 %v after; %d answered 503 sent again in %d rounds; %s (from read-only off)",
		name, seen.afterBack, seen.afterBackBad, tl.first(offAt), resent, rounds, st)
	s.LogDigest(t, began, onAt, true)
	finish(t, s)
}

// killSpan is when a test took servers away: from just before the first
// signal (or cut) to just after the call that did it returned, which for a
// kill waits for the processes to exit. A kill is an interval, not an
// instant: a COMMIT that reached a node just before its SIGKILL can be
// answered 503 before the exit is reaped.
type killSpan struct{ began, done time.Time }

// killing runs kill and returns its span.
func killing(kill func()) killSpan {
	began := time.Now()
	kill()
	return killSpan{began: began, done: time.Now()}
}

// inFlight says whether a was in flight at some moment of the kill: sent
// before it was over and answered after it began.
func (k killSpan) inFlight(a testkit.Answer) bool {
	return !k.began.IsZero() && a.Start.Before(k.done) && a.End.After(k.began)
}

// checkNothingHalfWritten compares every result's answer with the
// database: a result answered 200 has its id_commands row gone (the
// enrollment's step is complete) and its completion event in the outbox
// or delivered; one answered 503 has its row as it was enqueued (not
// completed, no result) and no event. Any row is either untouched or
// gone together with an event.
//
// The one exception is a webhook in flight when the server was killed
// (k, the zero killSpan for none): its COMMIT may have reached the server
// and its answer not, and the storage cannot tell until the server is
// back, so it answers 503 for a result that may be committed. Sent again,
// it answers 200 (the result is known), which the caller checks.
func checkNothingHalfWritten(t *testing.T, s *testkit.Stack, name string, answers []testkit.Answer, k killSpan) {
	t.Helper()
	for _, a := range compareWithDatabase(t, s, name, answers, k) {
		t.Errorf("%s: %s: a false 200: its result is not committed", name, a.X)
	}
}

// compareWithDatabase is checkNothingHalfWritten but for the results
// answered 200 and not committed, which it returns: on a promoted
// asynchronous replica, what the failover lost.
func compareWithDatabase(t *testing.T, s *testkit.Stack, name string, answers []testkit.Answer, k killSpan) (lost []testkit.Answer) {
	t.Helper()
	type row struct{ completed, hasResult bool }
	rows := map[string]row{}
	q, err := s.DB.Query(`SELECT enrollment_id, command_uuid, completed, result IS NOT NULL FROM id_commands`)
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var id, uuid string
		var rw row
		if err := q.Scan(&id, &uuid, &rw.completed, &rw.hasResult); err != nil {
			t.Fatal(err)
		}
		rows[id+"/"+uuid] = rw
	}
	q.Close()
	outbox := map[string]bool{}
	q, err = s.DB.Query(`SELECT step_id, COALESCE(enrollment_id, '') FROM stepcollect_outbox`)
	if err != nil {
		t.Fatal(err)
	}
	for q.Next() {
		var step int64
		var id string
		if err := q.Scan(&step, &id); err != nil {
			t.Fatal(err)
		}
		outbox[pairKey(step, id)] = true
	}
	q.Close()

	var wrong []string
	var committed, untouched, ambiguous int
	for _, a := range answers {
		id := a.X.R.ID(a.X.I)
		rw, present := rows[id+"/"+a.X.UUID()]
		// read after the rows: an event acknowledged meanwhile is at the
		// receiver, which records it before it acknowledges
		event := outbox[pairKey(a.X.StepID(), id)] || s.Rcv.Has(a.X.StepID(), id)
		switch {
		case present && (rw.completed || rw.hasResult):
			wrong = append(wrong, fmt.Sprintf("%s (answered %d): half-written: row completed=%v with a result=%v, not deleted", a.X, a.Status, rw.completed, rw.hasResult))
		case a.Status == http.StatusOK && present:
			// whether or not its event was delivered (by a server that
			// then lost the completion)
			lost = append(lost, a)
		case present && event:
			wrong = append(wrong, fmt.Sprintf("%s (answered %d): half-written: an event for a step the enrollment has not completed", a.X, a.Status))
		case !present && !event:
			wrong = append(wrong, fmt.Sprintf("%s (answered %d): half-written: row gone without an event", a.X, a.Status))
		case a.Status == http.StatusServiceUnavailable && !present && k.inFlight(a):
			ambiguous++
		case a.Status == http.StatusServiceUnavailable && !present:
			wrong = append(wrong, fmt.Sprintf("%s: answered 503 but committed", a.X))
		case present:
			untouched++
		default:
			committed++
		}
	}
	for i, w := range wrong {
		if i == 10 {
			t.Errorf("%s: … and %d more", name, len(wrong)-10)
			break
		}
		t.Errorf("%s: %s", name, w)
	}
	inFlight := ""
	if !k.began.IsZero() {
		inFlight = fmt.Sprintf(", %d committed and answered 503 (in flight at the kill)", ambiguous)
	}
	t.Logf("%s: before anything was sent again: %d results committed (answered 200), %d untouched (answered 503)%s, %d answered 200 and not committed, %d wrong",
		name, committed, untouched, inFlight, len(lost), len(wrong))
	return lost
}

// sendAgain sends the results answered 503 (or not at all) again, 32 at a
// time, as the enrollments must end up done; one that still fails is sent again until
// the bound from the fault's end (the sender's retry, not a wait). It
// returns how many rounds that took.
func sendAgain(t *testing.T, s *testkit.Stack, name string, again []testkit.Result, from time.Time) int {
	t.Helper()
	rounds := 0
	every(100*time.Millisecond, func() bool {
		if len(again) == 0 || time.Since(from) >= bound {
			return true
		}
		rounds++
		var still []testkit.Result
		// 32 at a time, as NanoMDM's own sender would: one after another,
		// hundreds of them would take seconds of the bound
		for _, a := range <-s.Stream(again, 0, 32) {
			if a.Err != nil || a.Status != http.StatusOK {
				still = append(still, a.X)
			}
		}
		again = still
		return len(again) == 0
	})
	if len(again) > 0 {
		t.Errorf("%s: %d results still not answered 200 %v after the fault ended", name, len(again), bound)
	}
	return rounds
}

// A request is in flight at a kill if it overlaps any moment of it: one
// answered while the processes were being reaped counts (the race a
// single instant taken after the kill lost), one that ended before the
// signal or began after the reap does not, and no kill counts nothing.
func TestAKillIsAnInterval(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	k := killSpan{began: at(100), done: at(300)}
	for _, c := range []struct {
		name       string
		start, end int
		want       bool
	}{
		{"answered while the exits were reaped", 50, 200, true},
		{"sent during the kill, answered after", 150, 400, true},
		{"across the whole kill", 0, 500, true},
		{"answered before the signal", 0, 90, false},
		{"sent after the reap", 310, 400, false},
	} {
		if got := k.inFlight(testkit.Answer{Start: at(c.start), End: at(c.end)}); got != c.want {
			t.Errorf("%s (%d–%d ms, kill 100–300 ms): in flight %v, want %v", c.name, c.start, c.end, got, c.want)
		}
	}
	if (killSpan{}).inFlight(testkit.Answer{Start: at(0), End: at(500)}) {
		t.Error("no kill: a request counted in flight")
	}
}
