package collector_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/tasks"
)

// The watch fires when Redis answers again after an outage, and when it
// comes back empty between two looks (its data, and the collect tasks in
// it, lost); never while nothing happens. Two deployments on the Redis
// database (markers of their own) both see a FLUSHALL: with one marker
// shared, only the first to write it again did.
func TestWatchQueueLossFiresOnRedisReturningAndOnItsDataGone(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, err := asynq.ParseRedisURI(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	reasons := map[string][]string{} // by marker
	got := func(m string) []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), reasons[m]...) }
	ctx, cancel := context.WithCancel(context.Background())
	markers := []string{tasks.NamesFor("aaaa").Marker, tasks.NamesFor("bbbb").Marker}
	var wg sync.WaitGroup
	for _, m := range markers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			collector.WatchQueueLoss(ctx, opt, m, 20*time.Millisecond, zerolog.Nop(), func(reason string) {
				mu.Lock()
				reasons[m] = append(reasons[m], reason)
				mu.Unlock()
			})
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	wait := func(what string, cond func(m string) bool) {
		t.Helper()
		for _, m := range markers {
			testkit.WaitUntil(t, 10*time.Second, what+" by the watch of "+m+" (it fired for)", func() (bool, any) { return cond(m), got(m) })
		}
	}
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + itoa(rs.Port)})
	defer rc.Close()
	wait("the marker set", func(m string) bool { return rc.Exists(context.Background(), m).Val() == 1 })
	for _, m := range markers {
		if r := got(m); len(r) != 0 {
			t.Fatalf("%s: fired with nothing lost: %v", m, r)
		}
	}

	if err := rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	wait("a loss seen after FLUSHALL", func(m string) bool { return len(got(m)) == 1 })

	rs.Kill()
	rs.Restart()
	wait("a loss seen after Redis was killed and restarted", func(m string) bool { return len(got(m)) >= 2 })
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}
