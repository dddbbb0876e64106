package collector_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/tasks"
)

// redisCalls is how many times the Redis server behind rc ran cmd.
func redisCalls(t *testing.T, rc *redis.Client, cmd string) int {
	t.Helper()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(strings.SplitN(v, ",", 2)[0])
			return n
		}
	}
	return 0
}

func newSweeper(t *testing.T, b *bundle, interval time.Duration) *collector.Sweeper {
	t.Helper()
	return collector.NewSweeper(collector.SweeperConfig{Interval: interval}, b.store, nil,
		metrics.NewSweeper(prometheus.NewRegistry()), zerolog.New(zerolog.NewTestWriter(t)))
}

// A worker starting sweeps at once, in process: a step whose hand-off was
// lost is collected without waiting for a sweep slot. With sweeps off
// (-sweep-interval 0) it does nothing.
func TestSweepAtStartCollectsWhatALostHandOffLeft(t *testing.T) {
	t.Parallel()
	b := setup(t)
	lost := b.storeStep(t, "lost", 2)
	newSweeper(t, b, 0).SweepAtStart(t.Context())
	if s, _, _ := b.exists(t, lost); s != 1 {
		t.Fatal("swept at start with sweeps off")
	}
	m := metrics.NewSweeper(prometheus.NewRegistry())
	collector.NewSweeper(collector.SweeperConfig{Interval: time.Hour}, b.store, nil, m,
		zerolog.New(zerolog.NewTestWriter(t))).SweepAtStart(t.Context())
	if s, _, raw := b.exists(t, lost); s != 0 || raw != 0 {
		t.Errorf("after the sweep at start: step %d, raw commands %d; want both gone", s, raw)
	}
	if n := testutil.ToFloat64(m.Sweeps.WithLabelValues("ok", metrics.SweepStart)); n != 1 {
		t.Errorf("sweeps_total{outcome=ok,trigger=start} %v, want the sweep at start counted", n)
	}
	var d dto.Metric
	if err := m.SweepDurationSeconds.Write(&d); err != nil {
		t.Fatal(err)
	}
	if n := d.GetHistogram().GetSampleCount(); n != 1 {
		t.Errorf("sweep_duration_seconds counted %d sweeps, want the sweep at start timed", n)
	}
}

// When the queue's Redis comes back empty, the collect tasks it held may be
// gone: the worker sweeps in process rather than waiting up to an interval.
func TestSweepOnQueueLossCollectsOnceRedisLostItsData(t *testing.T) {
	t.Parallel()
	b := setup(t)
	rs := testkit.StartRedis(t)
	opt, err := asynq.ParseRedisURI(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		newSweeper(t, b, time.Hour).SweepOnQueueLoss(ctx, opt, tasks.NamesFor("").Marker)
	}()
	defer func() { cancel(); <-done }()

	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + itoa(rs.Port)})
	defer rc.Close()
	testkit.WaitUntil(t, 15*time.Second, "the watch's marker set (exists)", func() (bool, any) {
		n := rc.Exists(context.Background(), "stepcollect:queue_marker").Val()
		return n == 1, n
	})
	lost := b.storeStep(t, "lost", 2) // released while its collect task sits in Redis …
	// the watch looks twice more and finds its marker: a sweep the first
	// look set off would be over by the second
	looked := redisCalls(t, rc, "setnx")
	testkit.WaitUntil(t, 15*time.Second, "the watch looking twice more (SETNX calls)", func() (bool, any) {
		n := redisCalls(t, rc, "setnx") - looked
		return n >= 2, n
	})
	if s, _, _ := b.exists(t, lost); s != 1 {
		t.Fatal("swept with nothing lost")
	}
	if err := rc.FlushAll(context.Background()).Err(); err != nil { // … which loses it
		t.Fatal(err)
	}
	testkit.WaitUntil(t, 15*time.Second, "the step collected after FLUSHALL (steps rows)", func() (bool, any) {
		s, _, _ := b.exists(t, lost)
		return s == 0, s
	})
}
