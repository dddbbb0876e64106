package metrics

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stepcollect/stepcollect/storage"
)

// StateCollector exports, at scrape time, the figures that must be the same
// whichever replica serves them: the outbox (how many events wait, how old
// the oldest is, how many are held), whether delivery is paused, the steps
// set aside, and the last sweep's findings, all read from MySQL. A
// gauge set in one process's memory would be right only in the replica that
// set it. Reads are cached for a few seconds so that many scrapers cost one
// query.
type StateCollector struct {
	read func(ctx context.Context) (storage.Gauges, error)
	ttl  time.Duration

	pending, oldest, uncollected, sweepAge, up, held, paused, setAside *prometheus.Desc

	mu   sync.Mutex
	at   time.Time
	last storage.Gauges
	err  error
}

// NewStateCollector reads the gauges through read, at most once per ttl.
func NewStateCollector(read func(ctx context.Context) (storage.Gauges, error), ttl time.Duration) *StateCollector {
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, nil, nil)
	}
	return &StateCollector{read: read, ttl: ttl,
		pending:     d("outbox_pending", "Events not yet acknowledged by the workflow engine, counted in the outbox at scrape time."),
		oldest:      d("outbox_oldest_event_age_seconds", "Age of the oldest event not yet acknowledged and not held, since written or released (0 when none): grows when deliveries stall."),
		uncollected: d("uncollected_steps", "Unreferenced steps still present, as the last sweep (by any replica) saw them."),
		sweepAge:    d("last_sweep_age_seconds", "Time since the last sweep by any replica recorded its findings (absent before the first)."),
		up:          d("state_up", "1 when the gauges above could be read from MySQL at the last scrape, 0 when not."),
		held:        d("outbox_held", "Events held after -max-delivery-attempts or -max-delivery-age, not tried again until an operator releases them (POST /v1/events/{event_id}/deliver)."),
		paused:      d("delivery_paused", "1 while an operator has paused delivery for every worker (POST /v1/delivery/pause), else 0."),
		setAside:    d("set_aside_events", "Due or timed-out steps whose event could not be written, kept in stepcollect_set_aside until an operator puts them back or gives them up."),
	}
}

// Describe implements prometheus.Collector.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.pending, c.oldest, c.uncollected, c.sweepAge, c.up, c.held, c.paused, c.setAside} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	g, err := c.get()
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(g.OutboxPending))
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, g.OldestEventAge.Seconds())
	ch <- prometheus.MustNewConstMetric(c.uncollected, prometheus.GaugeValue, float64(g.UncollectedSteps))
	ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(g.OutboxHeld))
	ch <- prometheus.MustNewConstMetric(c.setAside, prometheus.GaugeValue, float64(g.SetAside))
	paused := 0.0
	if g.DeliveryPaused {
		paused = 1
	}
	ch <- prometheus.MustNewConstMetric(c.paused, prometheus.GaugeValue, paused)
	if g.Swept {
		ch <- prometheus.MustNewConstMetric(c.sweepAge, prometheus.GaugeValue, g.LastSweepAge.Seconds())
	}
}

func (c *StateCollector) get() (storage.Gauges, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.ttl {
		return c.last, c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	c.last, c.err = c.read(ctx)
	c.at = time.Now()
	return c.last, c.err
}
