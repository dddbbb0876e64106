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
)

// The watch fires when Redis answers again after an outage, and when it
// comes back empty between two looks (its data, and the collect tasks in
// it, lost); never while nothing happens.
func TestWatchQueueLossFiresOnRedisReturningAndOnItsDataGone(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, err := asynq.ParseRedisURI(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var reasons []string
	got := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), reasons...) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		collector.WatchQueueLoss(ctx, opt, 20*time.Millisecond, zerolog.Nop(), func(reason string) {
			mu.Lock()
			reasons = append(reasons, reason)
			mu.Unlock()
		})
	}()
	defer func() { cancel(); <-done }()
	wait := func(what string, cond func() bool) {
		t.Helper()
		testkit.WaitUntil(t, 10*time.Second, what+" (the watch fired for)", func() (bool, any) { return cond(), got() })
	}
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + itoa(rs.Port)})
	defer rc.Close()
	wait("the marker set", func() bool { return rc.Exists(context.Background(), "stepcollect:queue_marker").Val() == 1 })
	if r := got(); len(r) != 0 {
		t.Fatalf("fired with nothing lost: %v", r)
	}

	if err := rc.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	wait("a loss seen after FLUSHALL", func() bool { return len(got()) == 1 })

	rs.Kill()
	rs.Restart()
	wait("a loss seen after Redis was killed and restarted", func() bool { return len(got()) >= 2 })
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
