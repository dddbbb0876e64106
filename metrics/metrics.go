// Package metrics declares stepcollect's Prometheus metrics. Names are part
// of the contract (docs/reference.md, "Metrics"): dashboards and alerts use them, so
// they are added to, never renamed.
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/storage"
)

// Namespace prefixes every stepcollect metric.
const Namespace = "stepcollect"

// Storage holds the metrics the storage reports, and is its Observer.
type Storage struct {
	ResultCommitSeconds prometheus.Histogram
	TxRetries           *prometheus.CounterVec
	StepsCollectedTotal prometheus.Counter
	CollectRuns         *prometheus.CounterVec
	CollectionLag       prometheus.Histogram
	EventsSetAside      *prometheus.CounterVec
}

var _ storage.Observer = (*Storage)(nil)

// NewStorage creates the storage metrics and registers them with reg.
func NewStorage(reg prometheus.Registerer) *Storage {
	m := &Storage{
		ResultCommitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "result_commit_seconds",
			Help:      "Time spent committing one command result in its enrollment-local transaction, retries included.",
			Buckets:   []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		TxRetries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "tx_retries_total",
			Help:      "Transactions rolled back and run again, by operation and reason (deadlock, lock_wait_timeout, connection).",
		}, []string{"op", "reason"}),
		StepsCollectedTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "steps_collected_total",
			Help:      "Steps deleted by collection.",
		}),
		CollectRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "collect_runs_total",
			Help:      "Step collection attempts, one per step, by outcome (collected, referenced, claimed_elsewhere, gone, error).",
		}, []string{"outcome"}),
		CollectionLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "collection_lag_seconds",
			Help:      "From the commit that left a step unreferenced to its deletion.",
			Buckets:   []float64{.005, .01, .025, .05, .1, .2, .3, .5, .75, 1, 1.5, 2, 3, 5, 10, 30, 60, 120, 300, 900},
		}),
		EventsSetAside: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "events_set_aside_total",
			Help:      "Due or timed-out steps whose event (type) could not be written, too large for max_allowed_packet or refused, and which were set aside so that the others go on.",
		}, []string{"type"}),
	}
	// Every series exists from the start, so rate() and alerts see zeros
	// rather than absent series.
	for _, op := range storage.TxOps {
		for _, reason := range storage.RetryReasons {
			m.TxRetries.WithLabelValues(op, reason)
		}
	}
	for _, o := range []storage.CollectOutcome{storage.CollectCollected, storage.CollectReferenced,
		storage.CollectClaimedElsewhere, storage.CollectGone, storage.CollectError} {
		m.CollectRuns.WithLabelValues(string(o))
	}
	for _, typ := range []string{events.StepDue, events.StepTimedOut} {
		m.EventsSetAside.WithLabelValues(typ)
	}
	reg.MustRegister(m.ResultCommitSeconds, m.TxRetries, m.StepsCollectedTotal, m.CollectRuns, m.CollectionLag, m.EventsSetAside)
	return m
}

// TxRetried implements storage.Observer.
func (m *Storage) TxRetried(op, reason string) { m.TxRetries.WithLabelValues(op, reason).Inc() }

// ResultCommitted implements storage.Observer.
func (m *Storage) ResultCommitted(d time.Duration, _ bool, _ error) {
	m.ResultCommitSeconds.Observe(d.Seconds())
}

// EventSetAside implements storage.Observer.
func (m *Storage) EventSetAside(eventType string) { m.EventsSetAside.WithLabelValues(eventType).Inc() }

// StepsCollected implements storage.Observer.
func (m *Storage) StepsCollected(res storage.CollectResult, observedAt []time.Time) {
	for outcome, n := range res {
		if n > 0 {
			m.CollectRuns.WithLabelValues(string(outcome)).Add(float64(n))
		}
	}
	m.StepsCollectedTotal.Add(float64(res[storage.CollectCollected]))
	now := time.Now()
	for _, t := range observedAt {
		if !t.IsZero() {
			m.CollectionLag.Observe(now.Sub(t).Seconds())
		}
	}
}
