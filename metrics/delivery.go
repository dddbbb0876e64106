package metrics

import "github.com/prometheus/client_golang/prometheus"

// Delivery outcomes, the outcome label of stepcollect_deliveries_total.
const (
	DeliveryOK        = "ok"         // 2xx: acknowledged, removed from the outbox
	DeliveryHTTPError = "http_error" // any other answer, or no connection
	DeliveryTimeout   = "timeout"    // no answer within 30 s
)

// Delivery holds the metrics of delivering events to the workflow engine.
type Delivery struct {
	Deliveries *prometheus.CounterVec
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
	reg.MustRegister(m.Deliveries)
	return m
}
