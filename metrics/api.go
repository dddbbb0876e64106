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

// HTTP counts and times a server's requests by route: the api's and
// cmd/nanocmd's.
type HTTP struct {
	Requests        *prometheus.CounterVec
	RequestDuration *prometheus.HistogramVec
}

// NewHTTP creates the request metrics and registers them with reg.
func NewHTTP(reg prometheus.Registerer) *HTTP {
	m := &HTTP{
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
	reg.MustRegister(m.Requests, m.RequestDuration)
	return m
}

// InstrumentHandler counts and times h's requests under name.
func (m *HTTP) InstrumentHandler(name string, h http.Handler) http.Handler {
	return promhttp.InstrumentHandlerCounter(m.Requests.MustCurryWith(prometheus.Labels{"handler": name}),
		promhttp.InstrumentHandlerDuration(m.RequestDuration.MustCurryWith(prometheus.Labels{"handler": name}), h))
}

// API holds the HTTP API's metrics.
type API struct {
	*HTTP
	Results *prometheus.CounterVec
	// InflightBodyBytes is the request-body budget in use
	// (-max-inflight-body-bytes): each body weighed at its decoding's
	// working memory, from before it is read until its handler returns.
	InflightBodyBytes prometheus.Gauge
	// UnknownCommandResults counts webhook results for a command no step
	// holds (also counted as results_total{outcome="ignored"}).
	UnknownCommandResults prometheus.Counter
}

// NewAPI creates the API metrics and registers them with reg.
func NewAPI(reg prometheus.Registerer) *API {
	m := &API{
		HTTP: NewHTTP(reg),
		Results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "results_total",
			Help:      "Webhook results by outcome: completed_step, stored, not_now, ignored, rejected, error.",
		}, []string{"outcome"}),
		InflightBodyBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: Namespace,
			Name:      "inflight_body_bytes",
			Help:      "Request-body bytes held against -max-inflight-body-bytes: each webhook or /v1/steps body weighed at its decoding's working memory, from before it is read until its handler returns.",
		}),
	}
	m.UnknownCommandResults = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: Namespace,
		Name:      "unknown_command_results_total",
		Help:      "Webhook results for a command no step holds for that enrollment: not sent by a workflow, its step finished or was cancelled, or stored after the command was enqueued.",
	})
	for _, o := range []string{OutcomeCompletedStep, OutcomeStored, OutcomeNotNow, OutcomeIgnored, OutcomeRejected, OutcomeError} {
		m.Results.WithLabelValues(o)
	}
	reg.MustRegister(m.Results, m.InflightBodyBytes, m.UnknownCommandResults)
	return m
}
