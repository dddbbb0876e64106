package app

import (
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// A task kept completed (asynq.Retention, as the sweeper's are) is not in
// asynq_queue_size: asynq's own QueueInfo.Size counts it, against its doc.
func TestQueueSizeLeavesOutCompletedTasks(t *testing.T) {
	rs := testkit.StartRedis(t)
	opt, err := asynq.ParseRedisURI(rs.URL)
	if err != nil {
		t.Fatal(err)
	}
	const queue = "sizetest"
	client := asynq.NewClient(opt)
	defer client.Close()
	if _, err := client.Enqueue(asynq.NewTask("size.test", nil), asynq.Queue(queue), asynq.Retention(time.Hour)); err != nil {
		t.Fatal(err)
	}
	qr := newQueueReader(opt)
	if st, err := qr.QueueStats(queue); err != nil || st.Size != 1 || st.Pending != 1 {
		t.Fatalf("before it runs: %+v, %v; want size 1, pending 1", st, err)
	}
	srv := asynq.NewServer(opt, asynq.Config{Queues: map[string]int{queue: 1}, Concurrency: 1, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	testkit.WaitUntil(t, 15*time.Second, "the task kept completed (queue stats)", func() (bool, any) {
		st, err := qr.QueueStats(queue)
		return err == nil && st.Completed == 1, st
	})
	if st, err := qr.QueueStats(queue); err != nil || st.Size != 0 {
		t.Errorf("once completed: %+v, %v; want size 0", st, err)
	}
}
