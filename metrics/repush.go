package metrics

import "github.com/prometheus/client_golang/prometheus"

// Re-push outcomes, the outcome label of stepcollect_repushes_total.
const (
	RePushOK        = "ok"         // NanoMDM's push API answered 2xx
	RePushHTTPError = "http_error" // it answered anything else (a redirect included: not followed)
	RePushError     = "error"      // no answer: refused connection, timeout, bad URL
)

// RePush holds the metrics of re-pushing enrollments that have not answered.
type RePush struct {
	RePushes *prometheus.CounterVec
}

// NewRePush creates the re-push metrics and registers them with reg.
func NewRePush(reg prometheus.Registerer) *RePush {
	m := &RePush{RePushes: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "repushes_total",
		Help:      "Enrollments re-pushed through NanoMDM's push API after -repush-interval without an answer, by outcome of their request (ok, http_error, error).",
	}, []string{"outcome"})}
	for _, o := range []string{RePushOK, RePushHTTPError, RePushError} {
		m.RePushes.WithLabelValues(o)
	}
	reg.MustRegister(m.RePushes)
	return m
}

// Pushed counts n enrollments whose push request ended in outcome.
func (m *RePush) Pushed(outcome string, n int) {
	if m != nil {
		m.RePushes.WithLabelValues(outcome).Add(float64(n))
	}
}
