// Package failover drives the built binaries through the failovers of a
// deployment that has outgrown one machine, while webhook results arrive:
//
//   - Redis behind Sentinel (a primary, a replica, three Sentinels, all
//     real processes): the primary SIGKILLed in the middle of a fan-out,
//     then, once it is back as a replica, a failover back to it asked of
//     Sentinel (sentinel_test.go);
//   - MySQL refusing writes for a while (read_only on a private server, as
//     a managed service does to the old primary while it fails over)
//     (readonly_test.go);
//   - MySQL killed (SIGKILL) and started again on the same datadir a few
//     seconds later, crash recovery included (restart_test.go);
//   - a Galera cluster losing, freezing or cutting off a node, or
//     restarted whole (galera_test.go); a Group Replication primary killed
//     or partitioned away, or the group restarted (group_test.go); and the
//     contrast to both, an asynchronous replica promoted after its primary
//     dies (replica_test.go). Galera and the replica run in the MariaDB
//     suite, Group Replication in MySQL's.
//
// The MySQL tests run on a private server of the suite's kind
// (testha.StartSQLServer): mariadbd under `make test`, Oracle MySQL 9.7's
// mysqld (scripts/mysql.sh's chroot) under `make test-mysql`, so CI runs
// them on both. The two differ in how a server is made read-only
// (read_only against super_read_only) and in how long a restart takes.
//
// Each round enqueues a step of its own to each of N enrollments (default
// 300, STEPCOLLECT_FAILOVER_N) and one step shared by all of them, then
// sends the 2N results at an even pace while the fault happens. Every
// flag but addresses, DSN, Redis URL and callback URL is at its default
// (-sweep-interval 30s), and the bound is guarantee 8 of docs/reference.md ("Guarantees"):
// within 15 s of the fault's end every step is collected and every event
// delivered. The tests log what they measured, each on a line starting
// with FAILOVER.
package failover

import (
	"database/sql"
	"fmt"
	"net/http"
	"sort"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// TestMain builds the binaries without the race detector (the bounds are
// about the service's own timing), or uses those in
// STEPCOLLECT_FAILOVER_BINDIR.
func TestMain(m *testing.M) {
	testkit.MainServices(m, "STEPCOLLECT_FAILOVER_BINDIR", false)
}

// bound is guarantee 8: from the end of a fault to every step collected
// and every event delivered.
const bound = testkit.SettleBound

const apiKey = "failover-api-key"

func enrollments() int { return testkit.EnvInt("STEPCOLLECT_FAILOVER_N", 300) }

// startStack is one api and one worker at default flags on dsn and
// redisURL, delivering to a receiver that holds every event to be one
// enrollment's step.completed; db is the test's own view of the database.
func startStack(t *testing.T, dsn, redisURL string, db *sql.DB) *testkit.Stack {
	t.Helper()
	s := testkit.StartStack(t, testkit.StackConfig{DSN: dsn, RedisURL: redisURL, DB: db, APIKey: apiKey,
		Receiver: &testkit.ReceiverOptions{CompletionsOnly: true}})
	// NanoMDM's webhook client gives up after 30 s (and does not resend)
	s.Client.WithTimeout(30 * time.Second)
	return s
}

func pairKey(stepID int64, enrollment string) string { return fmt.Sprintf("%d/%s", stepID, enrollment) }

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

// tally is what a round's answers were: 200s, 503s and anything else
// (each an error: only 200 or 503 are right), the results to send again
// (all but the 200s), and the first 200 of a webhook sent after the fault.
type tally struct {
	results, ok, unavailable, other int
	again                           []testkit.Result
	firstOK                         time.Time
	slowest                         time.Duration   // the longest any webhook took to be answered
	took503                         []time.Duration // how long each 503 took
}

func tallyAnswers(t *testing.T, name string, answers []testkit.Answer, fault time.Time) tally {
	t.Helper()
	tl := tally{results: len(answers)}
	for _, a := range answers {
		tl.slowest = max(tl.slowest, a.Took())
		switch {
		case a.Err == nil && a.Status == http.StatusOK:
			tl.ok++
			if a.Start.After(fault) && (tl.firstOK.IsZero() || a.End.Before(tl.firstOK)) {
				tl.firstOK = a.End
			}
			continue
		case a.Err == nil && a.Status == http.StatusServiceUnavailable:
			tl.unavailable++
			tl.took503 = append(tl.took503, a.Took())
		default:
			if tl.other++; tl.other <= 10 {
				t.Errorf("%s: webhook %s answered %d %q %v: only 200 or 503 are right", name, a.X, a.Status, a.Body, a.Err)
			}
		}
		tl.again = append(tl.again, a.X)
	}
	return tl
}

func (tl tally) String() string {
	return fmt.Sprintf("%d results, %d answered 200, %d 503, %d neither", tl.results, tl.ok, tl.unavailable, tl.other)
}

// first is how long after from the first 200 of a webhook sent after the
// fault came.
func (tl tally) first(from time.Time) string {
	if tl.firstOK.IsZero() {
		return "none within the results"
	}
	return tl.firstOK.Sub(from).Round(time.Millisecond).String()
}

// took503s is the p50, p99 and slowest of the 503s' answer times.
func (tl tally) took503s() string {
	p := func(q float64) time.Duration { return percentile(tl.took503, q).Round(time.Millisecond) }
	return fmt.Sprintf("p50 %v, p99 %v, slowest %v", p(50), p(99), p(100))
}

// outage is a fault during which a single server can commit nothing, as
// the webhooks saw it: from began (read-only on, the kill returned) to
// ending (the call that ends it issued), and back, once writes are
// answered again; each named as a failure says it ("read-only went on").
type outage struct {
	began, ending, back       time.Time
	during                    string // "read-only was on"
	beganAs, endingAs, backAs string // "read-only went on", "it went off", "read-only went off"
}

// outageSeen is what checkOutage counted: the webhooks sent after the
// outage began and answered before its end was issued (inside), those
// sent once writes were back (afterBack), and how many of each were
// answered wrong. (When the first of the latter was answered 200 is the
// tally's first, from tallyAnswers with the outage's back.)
type outageSeen struct {
	inside, insideBad, afterBack, afterBackBad int
}

// checkOutage holds answers to o: a webhook that cannot be committed is
// answered 503 within quick503; every one sent and answered inside the
// outage is a 503; every one sent once writes were back is a 200; and
// there were some of each, or the test did not test. At most ten wrong
// answers are reported.
func checkOutage(t *testing.T, name string, answers []testkit.Answer, o outage) outageSeen {
	t.Helper()
	var seen outageSeen
	bad := func(format string, args ...any) {
		if seen.insideBad+seen.afterBackBad <= 10 {
			t.Errorf(name+": "+format, args...)
		}
	}
	for _, a := range answers {
		if a.Err == nil && a.Status == http.StatusServiceUnavailable && a.Took() > quick503 {
			t.Errorf("%s: webhook %s answered 503 after %v, not within %v", name, a.X, a.Took().Round(time.Millisecond), quick503)
		}
		if a.Start.After(o.began) && a.End.Before(o.ending) {
			seen.inside++
			if a.Err != nil || a.Status != http.StatusServiceUnavailable {
				seen.insideBad++
				bad("webhook %s sent %v after %s and answered %d before %s: a 503 was due",
					a.X, a.Start.Sub(o.began).Round(time.Millisecond), o.beganAs, a.Status, o.endingAs)
			}
		}
		if a.Start.After(o.back) {
			seen.afterBack++
			if a.Err != nil || a.Status != http.StatusOK {
				seen.afterBackBad++
				bad("webhook %s sent %v after %s answered %d %q: a 200 was due",
					a.X, a.Start.Sub(o.back).Round(time.Millisecond), o.backAs, a.Status, a.Body)
			}
		}
	}
	if seen.inside == 0 {
		t.Errorf("%s: no webhook was sent and answered while %s: the test did not test", name, o.during)
	}
	if seen.afterBack == 0 {
		t.Errorf("%s: no webhook was sent after %s (%v after %s): the test did not test recovery",
			name, o.backAs, o.back.Sub(o.ending).Round(time.Millisecond), o.endingAs)
	}
	return seen
}

// atScheduled waits until at, a point on a fault's own schedule (a kill
// 1.5 s into a stream of results, an operator's decision 2 s on): the
// fault is placed in time, there is no condition to wait for.
func atScheduled(at time.Time) { time.Sleep(time.Until(at)) }

// every runs step, then again every period until it says it is done: a
// balancer's health check, a sender's retries. The period is theirs, not
// a wait for a condition.
func every(period time.Duration, step func() (done bool)) {
	for !step() {
		time.Sleep(period)
	}
}
