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
//     seconds later, crash recovery included (restart_test.go).
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
