package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// QueueStats is one queue as the queue reports it at scrape time.
type QueueStats struct {
	Size    int           // tasks in every state but completed
	Latency time.Duration // age of the oldest pending task
	// tasks by state
	Pending, Active, Scheduled, Retry, Archived, Completed int
}

// QueueReader reads the queues at scrape time (the binaries read asynq's
// Inspector). An interface, so that the packages that only count
// things of their own (delivery) do not link the queue.
type QueueReader interface {
	// Queues names the queues that exist.
	Queues() ([]string, error)
	// QueueStats reads one of them.
	QueueStats(queue string) (QueueStats, error)
}

// QueueCollector exports asynq's own view of its queues, read at scrape
// time. asynq's x/metrics does the same but has no semver tags to pin;
// this is the small part of it stepcollect needs.
type QueueCollector struct {
	inspector QueueReader
	queues    []string

	size    *prometheus.Desc
	latency *prometheus.Desc
	tasks   *prometheus.Desc
	up      *prometheus.Desc
}

// NewQueueCollector returns a collector for queues, read through inspector.
func NewQueueCollector(inspector QueueReader, queues ...string) *QueueCollector {
	return &QueueCollector{
		inspector: inspector,
		queues:    queues,
		size: prometheus.NewDesc("asynq_queue_size", "Tasks in the queue, in every state but completed.",
			[]string{"queue"}, nil),
		latency: prometheus.NewDesc("asynq_queue_latency_seconds", "Age of the oldest pending task in the queue.",
			[]string{"queue"}, nil),
		tasks: prometheus.NewDesc("asynq_tasks", "Tasks in the queue by state.",
			[]string{"queue", "state"}, nil),
		up: prometheus.NewDesc("stepcollect_queue_up", "1 when the queue's Redis answered this scrape.",
			nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *QueueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.size
	ch <- c.latency
	ch <- c.tasks
	ch <- c.up
}

// Collect implements prometheus.Collector. When Redis does not answer it
// exports only stepcollect_queue_up 0, rather than zeros that would read as
// an empty queue.
func (c *QueueCollector) Collect(ch chan<- prometheus.Metric) {
	existing, err := c.inspector.Queues()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	exists := map[string]bool{}
	for _, q := range existing {
		exists[q] = true
	}
	up := 1.0
	for _, q := range c.queues {
		if !exists[q] { // nothing was ever enqueued to it: empty
			ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, 0, q)
			ch <- prometheus.MustNewConstMetric(c.latency, prometheus.GaugeValue, 0, q)
			continue
		}
		info, err := c.inspector.QueueStats(q)
		if err != nil {
			up = 0
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.size, prometheus.GaugeValue, float64(info.Size), q)
		ch <- prometheus.MustNewConstMetric(c.latency, prometheus.GaugeValue, info.Latency.Seconds(), q)
		for state, n := range map[string]int{"pending": info.Pending, "active": info.Active, "scheduled": info.Scheduled,
			"retry": info.Retry, "archived": info.Archived, "completed": info.Completed} {
			ch <- prometheus.MustNewConstMetric(c.tasks, prometheus.GaugeValue, float64(n), q, state)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}
