package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Webhook result outcomes, the label values of stepcollect_results_total.
const (
	OutcomeCompletedStep = "completed_step" // committed, and it completed the enrollment's step
	OutcomeStored        = "stored"         // committed; other commands of the step still outstanding
	OutcomeNotNow        = "not_now"        // committed as not completed
	OutcomeIgnored       = "ignored"        // Idle, not a workflow's command, a topic not acted on
	OutcomeRejected      = "rejected"       // 400, 401, 413
	OutcomeError         = "error"          // 503: could not commit
)

// API holds the HTTP API's metrics.
type API struct {
	Results         *prometheus.CounterVec
	Requests        *prometheus.CounterVec
	RequestDuration *prometheus.HistogramVec
}

// NewAPI creates the API metrics and registers them with reg.
func NewAPI(reg prometheus.Registerer) *API {
	m := &API{
		Results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "results_total",
			Help:      "Webhook results by outcome: completed_step, stored, not_now, ignored, rejected, error.",
		}, []string{"outcome"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "http_requests_total",
			Help:      "HTTP requests by handler and status code.",
		}, []string{"handler", "code"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace,
			Name:      "http_request_duration_seconds",
			Help:      "HTTP request latency by handler.",
			Buckets:   []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"handler"}),
	}
	for _, o := range []string{OutcomeCompletedStep, OutcomeStored, OutcomeNotNow, OutcomeIgnored, OutcomeRejected, OutcomeError} {
		m.Results.WithLabelValues(o)
	}
	reg.MustRegister(m.Results, m.Requests, m.RequestDuration)
	return m
}

// InstrumentHandler counts and times h's requests under name.
func (m *API) InstrumentHandler(name string, h http.Handler) http.Handler {
	return promhttp.InstrumentHandlerCounter(m.Requests.MustCurryWith(prometheus.Labels{"handler": name}),
		promhttp.InstrumentHandlerDuration(m.RequestDuration.MustCurryWith(prometheus.Labels{"handler": name}), h))
}
