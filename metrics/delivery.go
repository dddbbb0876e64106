package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Delivery outcomes, the outcome label of stepcollect_deliveries_total.
const (
	DeliveryOK        = "ok"         // 2xx: acknowledged, removed from the outbox
	DeliveryHTTPError = "http_error" // any other answer, or no connection
	DeliveryTimeout   = "timeout"    // no answer within 30 s
)

// Delivery holds the metrics of delivering events to the workflow engine.
type Delivery struct {
	Deliveries *prometheus.CounterVec
	// probing is what stepcollect_delivery_probing reads at scrape time
	// (the worker's dispatcher, SetProbing); 0 without one
	probing atomic.Pointer[func() bool]
}

// NewDelivery creates the delivery metrics and registers them with reg.
func NewDelivery(reg prometheus.Registerer, eventTypes ...string) *Delivery {
	m := &Delivery{
		Deliveries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "deliveries_total",
			Help:      "Callback attempts by event type and outcome (ok, http_error, timeout).",
		}, []string{"type", "outcome"}),
	}
	for _, t := range eventTypes {
		for _, o := range []string{DeliveryOK, DeliveryHTTPError, DeliveryTimeout} {
			m.Deliveries.WithLabelValues(t, o)
		}
	}
	// Read when scraped rather than set at each change: the brake is
	// engaged and released by concurrent POSTs, and a value set by one of
	// them could land after another's and stay wrong until the next change.
	probing := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace,
		Name:      "delivery_probing",
		Help:      "1 while this worker takes the receiver to be down and tries one event at a time (every 250 ms) instead of every due event, else 0.",
	}, func() float64 {
		if f := m.probing.Load(); f != nil && (*f)() {
			return 1
		}
		return 0
	})
	reg.MustRegister(m.Deliveries, probing)
	return m
}

// SetProbing makes stepcollect_delivery_probing read probing at scrape
// time: the worker's dispatcher says whether it is probing the receiver.
func (m *Delivery) SetProbing(probing func() bool) {
	if m != nil {
		m.probing.Store(&probing)
	}
}
