package tasks

import (
	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/metrics"
)

// QueueReader reads asynq's queues for metrics.QueueCollector, through an
// Inspector that gives up quickly when Redis is down (WithFastFailure).
type QueueReader struct{ insp *asynq.Inspector }

var _ metrics.QueueReader = QueueReader{}

// NewQueueReader returns a QueueReader on Redis r.
func NewQueueReader(r asynq.RedisConnOpt) QueueReader {
	return QueueReader{asynq.NewInspector(WithFastFailure(r))}
}

// Queues implements metrics.QueueReader.
func (q QueueReader) Queues() ([]string, error) { return q.insp.Queues() }

// QueueStats implements metrics.QueueReader.
func (q QueueReader) QueueStats(queue string) (metrics.QueueStats, error) {
	info, err := q.insp.GetQueueInfo(queue)
	if err != nil {
		return metrics.QueueStats{}, err
	}
	return metrics.QueueStats{Size: info.Size, Latency: info.Latency, Pending: info.Pending, Active: info.Active,
		Scheduled: info.Scheduled, Retry: info.Retry, Archived: info.Archived, Completed: info.Completed}, nil
}
