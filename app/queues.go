package app

import (
	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/tasks"
)

// queueReader reads asynq's queues for metrics.QueueCollector, through an
// Inspector that gives up quickly when Redis is down (tasks.WithFastFailure).
type queueReader struct{ insp *asynq.Inspector }

var _ metrics.QueueReader = queueReader{}

func newQueueReader(r asynq.RedisConnOpt) queueReader {
	return queueReader{asynq.NewInspector(tasks.WithFastFailure(r))}
}

// Queues implements metrics.QueueReader.
func (q queueReader) Queues() ([]string, error) { return q.insp.Queues() }

// QueueStats implements metrics.QueueReader.
func (q queueReader) QueueStats(queue string) (metrics.QueueStats, error) {
	info, err := q.insp.GetQueueInfo(queue)
	if err != nil {
		return metrics.QueueStats{}, err
	}
	// asynq v0.26 documents Size as every state but completed, and adds
	// completed in: the sweeper's tasks are kept completed a while, and a
	// "queue not empty" alert on asynq_queue_size never cleared.
	return metrics.QueueStats{Size: max(0, info.Size-info.Completed), Latency: info.Latency, Pending: info.Pending, Active: info.Active,
		Scheduled: info.Scheduled, Retry: info.Retry, Archived: info.Archived, Completed: info.Completed}, nil
}
