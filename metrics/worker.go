package metrics

import "github.com/prometheus/client_golang/prometheus"

// The trigger label values of stepcollect_sweeps_total.
const (
	SweepPeriodic     = "periodic"      // the sweep interval's
	SweepStart        = "start"         // a worker starting
	SweepQueueLoss    = "queue_loss"    // the queue's Redis back after failing, or back empty
	SweepServerChange = "server_change" // a database server not seen before answering
)

// Sweeper holds the sweeper's metrics.
type Sweeper struct {
	Sweeps               *prometheus.CounterVec
	OrphanedStepCommands prometheus.Counter
	SweepDurationSeconds prometheus.Histogram
}

// NewSweeper creates the sweeper metrics and registers them with reg.
func NewSweeper(reg prometheus.Registerer) *Sweeper {
	m := &Sweeper{
		Sweeps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "sweeps_total",
			Help:      "Sweeps run by this replica, by outcome (ok, error) and trigger (periodic; start, queue_loss, server_change: the in-process sweeps after those events). The worker's periodic sweeps are one per interval across replicas.",
		}, []string{"outcome", "trigger"}),
		OrphanedStepCommands: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "orphaned_step_commands_deleted_total",
			Help:      "Raw commands deleted by the sweeper because their step was gone (only possible without the foreign key).",
		}),
		SweepDurationSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "sweep_duration_seconds",
			Help:      "How long one sweep took.",
			Buckets:   prometheus.ExponentialBuckets(0.005, 3, 10),
		}),
	}
	for _, outcome := range []string{"ok", "error"} {
		for _, trigger := range []string{SweepPeriodic, SweepStart, SweepQueueLoss, SweepServerChange} {
			m.Sweeps.WithLabelValues(outcome, trigger)
		}
	}
	reg.MustRegister(m.Sweeps, m.OrphanedStepCommands, m.SweepDurationSeconds)
	return m
}

// Enqueue holds the metrics of putting tasks on the queue.
type Enqueue struct {
	Failures *prometheus.CounterVec
	// HandoffDropped counts released steps the api's hand-off dropped
	// because it already held as many as it keeps while Redis is down.
	HandoffDropped prometheus.Counter
}

// NewEnqueue creates the enqueue metrics and registers them with reg.
func NewEnqueue(reg prometheus.Registerer, taskTypes ...string) *Enqueue {
	m := &Enqueue{Failures: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "enqueue_failures_total",
		Help:      "Tasks that could not be enqueued after a commit (Redis down); the hand-off tries again, and the sweeper finds what it drops.",
	}, []string{"task"}),
		HandoffDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "handoff_dropped_steps_total",
			Help:      "Released steps the api dropped while Redis was down, past what it keeps; the sweeper collects them.",
		})}
	for _, t := range taskTypes {
		m.Failures.WithLabelValues(t)
	}
	reg.MustRegister(m.Failures, m.HandoffDropped)
	return m
}

// Failed counts one failed enqueue of task.
func (m *Enqueue) Failed(task string) { m.Failures.WithLabelValues(task).Inc() }
