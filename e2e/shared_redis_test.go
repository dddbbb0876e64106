package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// Two deployments (each an api and a worker on its own database) on one
// Redis database, at default -redis-url style: each collects its own steps
// and delivers its own events, with the sweeper off, so nothing can hide a
// collect task taken by the other deployment's worker (which would look
// its step ids up in the wrong database and leave the step for a sweep
// that never comes). Each exports its own queue only.
func TestTwoDeploymentsOnOneRedisDatabaseKeepToTheirOwnTasks(t *testing.T) {
	rs := testkit.StartRedis(t)
	var stacks [2]*testkit.Stack
	for i := range stacks {
		db := testkit.NewDB(t, nil)
		stacks[i] = testkit.StartStack(t, testkit.StackConfig{
			DSN: db.DSN, RedisURL: rs.URL, DB: db.DB, APIKey: apiKey,
			Env: []string{"STEPCOLLECT_LOG_LEVEL=warn"}, WorkerArgs: []string{"-sweep-interval", "0"},
			Receiver: &testkit.ReceiverOptions{CompletionsOnly: true},
		})
	}
	const n = 60
	var answers [2]<-chan []testkit.Answer
	for i, s := range stacks {
		r := s.EnqueueRound(t, fmt.Sprintf("SHARED-REDIS-%d", i), n)
		answers[i] = s.Stream(r.Results(), 2*time.Second, 16)
	}
	for i := range stacks {
		for _, a := range <-answers[i] {
			if a.Err != nil || a.Status != 200 {
				t.Fatalf("deployment %d: %s: %d %q %v", i, a.X, a.Status, a.Body, a.Err)
			}
		}
	}
	from := time.Now()
	for i, s := range stacks {
		st := s.AwaitSettled(t, from, fmt.Sprintf("deployment %d", i), func() { s.Explain(t, from, nil) })
		t.Logf("deployment %d: %s", i, st)
		s.CheckReceiver(t)
		// each worker collected exactly its own steps: n own and one
		// shared (the counter moves just after the deletes commit: wait
		// for it, then look once more for any step counted twice)
		collected := func() float64 {
			fams, err := scrape.Families(s.MetricsURL())
			if err != nil {
				t.Fatal(err)
			}
			return scrape.Value(fams, "stepcollect_steps_collected_total")
		}
		testkit.WaitUntil(t, 10*time.Second, fmt.Sprintf("deployment %d's worker to count %d collected steps", i, n+1), func() (bool, any) {
			got := collected()
			return got >= n+1, got
		})
		if got := collected(); got != n+1 {
			t.Errorf("deployment %d: worker steps_collected_total = %v, want %d", i, got, n+1)
		}
	}
}
