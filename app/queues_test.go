package app

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/tasks"
)

// A task kept completed (asynq.Retention, as the sweeper's are) is not in
// asynq_queue_size: asynq's own QueueInfo.Size counts it, against its doc.
func TestQueueSizeLeavesOutCompletedTasks(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, err := asynq.ParseRedisURI(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	names := tasks.NamesFor("sizetest")
	queue := names.Collect
	client := asynq.NewClient(opt)
	defer client.Close()
	if _, err := client.Enqueue(asynq.NewTask("size.test", nil), asynq.Queue(queue), asynq.Retention(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// another deployment's queue on the same Redis database is not this one's
	if _, err := client.Enqueue(asynq.NewTask("size.test", nil), asynq.Queue(tasks.NamesFor("other").Collect)); err != nil {
		t.Fatal(err)
	}
	qr := newQueueReader(opt, tasks.NewNamespace(names))
	if qs, err := qr.Queues(); err != nil || len(qs) != 1 || qs[0] != tasks.QueueCollect {
		t.Errorf("queues: %q, %v; want only this deployment's %q", qs, err, tasks.QueueCollect)
	}
	if st, err := qr.QueueStats(tasks.QueueCollect); err != nil || st.Size != 1 || st.Pending != 1 || st.Latency <= 0 || st.Latency > time.Minute {
		t.Fatalf("before it runs: %+v, %v; want size 1, pending 1, and its age as the latency", st, err)
	}
	srv := asynq.NewServer(opt, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	testkit.WaitUntil(t, 15*time.Second, "the task kept completed (queue stats)", func() (bool, any) {
		st, err := qr.QueueStats(tasks.QueueCollect)
		return err == nil && st.Completed == 1, st
	})
	if st, err := qr.QueueStats(tasks.QueueCollect); err != nil || st.Size != 0 {
		t.Errorf("once completed: %+v, %v; want size 0", st, err)
	}
}

// queueUp is stepcollect_queue_up, and asynq_queue_size of queue, as a
// scrape of qr reads them.
func queueUp(t *testing.T, qr metrics.QueueReader, queue string) (up, size float64) {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics.NewQueueCollector(qr, queue))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	size = -1
	for _, mf := range mfs {
		switch mf.GetName() {
		case "stepcollect_queue_up":
			up = mf.GetMetric()[0].GetGauge().GetValue()
		case "asynq_queue_size":
			size = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return up, size
}

// A completed task whose key expired before asynq's janitor took it out of
// the completed set makes asynq's GetQueueInfo fail (hibiken/asynq#728):
// the queue is still up while Redis answers, and down once it does not.
func TestAnExpiredTaskKeyDoesNotTakeTheQueueDown(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, err := asynq.ParseRedisURI(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	names := tasks.NamesFor("expiry")
	queue := names.Collect
	client := asynq.NewClient(opt)
	defer client.Close()
	for _, id := range []string{"kept", "expiring"} {
		if _, err := client.Enqueue(asynq.NewTask("expiry.test", nil), asynq.Queue(queue), asynq.TaskID(id), asynq.Retention(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Enqueue(asynq.NewTask("expiry.test", nil), asynq.Queue(queue), asynq.ProcessIn(time.Hour)); err != nil {
		t.Fatal(err)
	}
	srv := asynq.NewServer(opt, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	testkit.WaitUntil(t, 15*time.Second, "both tasks kept completed", func() (bool, any) {
		info, err := insp.GetQueueInfo(queue)
		return err == nil && info.Completed == 2, info
	})
	srv.Shutdown() // no janitor: the expired key stays listed, as between two janitor runs

	// the task's key expires; its id is still in the completed set
	rc := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", rs.Port)})
	defer rc.Close()
	if n, err := rc.Del(t.Context(), "asynq:{"+queue+"}:t:expiring").Result(); err != nil || n != 1 {
		t.Fatalf("expiring the task key: %d, %v", n, err)
	}
	if _, err := insp.GetQueueInfo(queue); err == nil {
		t.Log("asynq's GetQueueInfo no longer fails on an expired task key")
	}

	qr := newQueueReader(opt, tasks.NewNamespace(names))
	if up, size := queueUp(t, qr, tasks.QueueCollect); up != 1 || size != 1 {
		t.Errorf("with an expired task key: stepcollect_queue_up %v, asynq_queue_size %v; want 1 and 1 (the scheduled task)", up, size)
	}
	rs.Kill()
	if up, _ := queueUp(t, qr, tasks.QueueCollect); up != 0 {
		t.Errorf("with Redis down: stepcollect_queue_up %v, want 0", up)
	}
}
