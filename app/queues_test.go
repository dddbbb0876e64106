package app

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/tasks"
)

// A task kept completed (asynq.Retention, as the sweeper's are) is not in
// asynq_queue_size: asynq's own QueueInfo.Size counts it, against its doc.
func TestQueueSizeLeavesOutCompletedTasks(t *testing.T) {
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
	if st, err := qr.QueueStats(tasks.QueueCollect); err != nil || st.Size != 1 || st.Pending != 1 {
		t.Fatalf("before it runs: %+v, %v; want size 1, pending 1", st, err)
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
