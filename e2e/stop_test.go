package e2e

import (
	"database/sql"
	"fmt"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// A graceful stop hands its last released steps to the queue: 200 steps of
// one enrollment each, all 200 results, SIGTERM to the api as soon as the
// last is answered, and with the sweeper off every step is collected by
// the worker within seconds of the stop (the requirement is one second;
// the bound leaves room for a loaded machine, the time is logged). Three
// rounds, each on a fresh api: whether a stop lands in the hand-off's
// gathering window is up to timing.
func TestAStoppedAPIHandsItsLastReleasedStepsToTheQueue(t *testing.T) {
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	s := testkit.StartStack(t, testkit.StackConfig{
		DSN: db.DSN, RedisURL: rs.URL, DB: db.DB, APIKey: apiKey,
		Env: []string{"STEPCOLLECT_LOG_LEVEL=warn"}, WorkerArgs: []string{"-sweep-interval", "0"},
	})
	api, client := s.API, s.Client
	for round := range 3 {
		if round > 0 {
			var url string
			api, url = testkit.StartService(t, s.API.Cmd.Path,
				testkit.ServiceEnv(db.DSN, rs.URL, "STEPCOLLECT_LOG_LEVEL=warn", "STEPCOLLECT_API_KEY="+apiKey), "listen")
			client = testkit.NewClient(url, apiKey)
		}
		took := stopRightAfterResults(t, api, client, s.DB, fmt.Sprintf("STOP%d", round), 200)
		t.Logf("round %d: all 200 steps collected %v after the SIGTERM", round, took.Round(time.Millisecond))
	}
}

// stopRightAfterResults makes n steps of one enrollment each, sends their
// n results, sends SIGTERM to api once the last is answered and returns
// how long after it the last step was gone.
func stopRightAfterResults(t *testing.T, api *testkit.Proc, client *testkit.Client, db *sql.DB, prefix string, n int) time.Duration {
	t.Helper()
	ids, uuids := make([]string, n), make([]string, n)
	var mu sync.Mutex
	var errs []error
	testkit.ForEach(n, 8, func(i int) {
		ids[i], uuids[i] = fmt.Sprintf("%s-E%04d", prefix, i), fmt.Sprintf("%s-CMD-%04d", prefix, i)
		_, err := client.Enqueue(testkit.V1Step(uuids[i], []string{ids[i]}, uuids[i]))
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
		}
	})
	if len(errs) > 0 {
		t.Fatalf("%s: %d enqueues failed, first: %v", prefix, len(errs), errs[0])
	}
	testkit.ForEach(n, 32, func(i int) {
		status, body, err := client.Webhook(testkit.Acknowledged(ids[i], uuids[i]))
		mu.Lock()
		defer mu.Unlock()
		if err != nil || status != http.StatusOK {
			errs = append(errs, fmt.Errorf("result of %s: %d %s %v", ids[i], status, body, err))
		}
	})
	stop := time.Now()
	api.Cmd.Process.Signal(syscall.SIGTERM)
	if len(errs) > 0 {
		t.Fatalf("%s: %d results not answered 200, first: %v", prefix, len(errs), errs[0])
	}
	testkit.WaitUntil(t, 5*time.Second, prefix+": every released step collected after the api's SIGTERM, sweeper off (steps left)", func() (bool, any) {
		left := testkit.CountStepRows(t, db).Steps
		return left == 0, left
	})
	took := time.Since(stop)
	// the exit is not timed: a -race binary sleeps 1 s in it
	if err := api.Cmd.Wait(); err != nil {
		t.Errorf("%s: api on SIGTERM: %v", prefix, err)
	}
	return took
}
