// Package pace drives the built binaries (without the race detector, at
// full speed) the way a busy NanoCMD deployment does, to prove that the
// worker pool keeps pace: with the sweeper off, every step is collected and
// every event delivered, in every round, and none strands.
package pace

import (
	"cmp"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// TestMain builds the binaries, or uses those in STEPCOLLECT_PACE_BINDIR
// (to run this test against another build, such as an older commit's).
func TestMain(m *testing.M) {
	testkit.MainServices(m, "STEPCOLLECT_PACE_BINDIR", false)
}

const apiKey = "pace-api-key"

// NanoCMD's most common shape, a step of its own for each enrollment
// (per-device workflows), answered through the webhook as fast as the api
// takes them, with the sweeper off and the scheduler claiming steps rows
// every second: every step must be collected and every step.completed
// delivered within seconds of the round's last 200, in every round. A
// skipped SKIP LOCKED claim that was taken for a collection, or a
// deduplicated hand-off, strands steps here.
//
// STEPCOLLECT_PACE_ROUNDS and STEPCOLLECT_PACE_N size it (default 20
// rounds of 3000).
func TestNoStepStrandsWithTheSweeperOff(t *testing.T) {
	rounds, n := testkit.EnvInt("STEPCOLLECT_PACE_ROUNDS", 20), testkit.EnvInt("STEPCOLLECT_PACE_N", 3000)
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	s := testkit.StartStack(t, testkit.StackConfig{
		DSN: db.DSN, RedisURL: rs.URL, DB: db.DB, APIKey: apiKey, Env: []string{"STEPCOLLECT_LOG_LEVEL=warn"},
		WorkerArgs: []string{"-sweep-interval", "0", "-schedule-interval", "1s"},
		Receiver:   &testkit.ReceiverOptions{CompletionsOnly: true},
	})
	// parallel runs f(i) for i in [0,n) with width at once, failing after
	// them all on the first error, with how many failed and whether the api
	// and the worker still run: a request that got no answer (EOF) is the
	// api's doing if it runs, and its death's if not.
	parallel := func(width int, f func(i int) error) {
		var mu sync.Mutex
		var first error
		failed := 0
		testkit.ForEach(n, width, func(i int) {
			if err := f(i); err != nil {
				mu.Lock()
				first = cmp.Or(first, err)
				failed++
				mu.Unlock()
			}
		})
		if first != nil {
			t.Fatalf("%d of %d failed, the first: %v; api %s, worker %s", failed, n, first, s.API.Describe(), s.Worker().Describe())
		}
	}

	delivered := 0
	for round := range rounds {
		id := func(i int) string { return fmt.Sprintf("R%02d-E%05d", round, i) }
		uuid := func(i int) string { return fmt.Sprintf("R%02d-C%05d", round, i) }
		parallel(16, func(i int) error {
			if _, err := s.Client.Enqueue(testkit.V1Step(uuid(i), []string{id(i)}, uuid(i))); err != nil {
				return fmt.Errorf("round %d: enqueue %d: %w", round, i, err)
			}
			return nil
		})
		start := time.Now()
		parallel(64, func(i int) error {
			if status, b, err := s.Client.Webhook(testkit.Acknowledged(id(i), uuid(i))); err != nil || status != http.StatusOK {
				return fmt.Errorf("round %d: webhook %d: %d %.200s %v", round, i, status, b, err)
			}
			return nil
		})
		answered := time.Since(start)
		collected := testkit.WaitUntil(t, 15*time.Second, fmt.Sprintf("round %d: every step collected with the sweeper off (step rows left)", round), func() (bool, any) {
			left := testkit.CountStepRows(t, db.DB)
			return left.Steps == 0, left
		})
		delivered += n
		events := testkit.WaitUntil(t, 15*time.Second, fmt.Sprintf("round %d: %d events delivered (distinct delivered)", round, delivered), func() (bool, any) {
			got := s.Rcv.Distinct()
			return got == delivered, got
		})
		t.Logf("round %2d: %d results answered in %v (%.0f/s); steps collected %v and events delivered %v after the last 200",
			round, n, answered.Round(time.Millisecond), float64(n)/answered.Seconds(), collected.Round(time.Millisecond), events.Round(time.Millisecond))
	}
	if left := testkit.CountStepRows(t, db.DB); left.Steps != 0 || left.IDCommands != 0 {
		t.Errorf("left: %+v", left)
	}
	s.Rcv.Check(t)
	s.Stop(t)
}
