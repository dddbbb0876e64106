package metrics

import "github.com/prometheus/client_golang/prometheus"

// Outcomes of an enqueue through the MDM server's API, the outcome label of
// stepcollect_mdm_enqueues_total.
const (
	MDMEnqueueOK      = "ok"      // the MDM server queued the command for the enrollment
	MDMEnqueueRefused = "refused" // it answered a command_error for it, or a non-2xx without one
	MDMEnqueueError   = "error"   // no answer: refused connection, timeout, bad URL
)

// MDM holds the metrics of cmd/nanocmd's requests to the MDM server and of
// the workflows it runs.
type MDM struct {
	Enqueues       *prometheus.CounterVec
	PushFailures   prometheus.Counter
	WorkflowErrors *prometheus.CounterVec
}

// NewMDM creates the MDM metrics and registers them with reg.
func NewMDM(reg prometheus.Registerer) *MDM {
	m := &MDM{
		Enqueues: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "mdm_enqueues_total",
			Help:      "Enrollments a command was enqueued for through the MDM server's API, by outcome (ok, refused, error). A refused or failed one's step is cancelled for that enrollment.",
		}, []string{"outcome"}),
		PushFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "mdm_push_failures_total",
			Help:      "Enrollments whose command was enqueued but whose APNs push the MDM server reported failed; the device gets the command at its next check-in.",
		}),
		WorkflowErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace,
			Name:      "workflow_errors_total",
			Help:      "Results stored whose workflow then failed to handle the completed step (the webhook still answered 200), by workflow.",
		}, []string{"workflow"}),
	}
	for _, o := range []string{MDMEnqueueOK, MDMEnqueueRefused, MDMEnqueueError} {
		m.Enqueues.WithLabelValues(o)
	}
	reg.MustRegister(m.Enqueues, m.PushFailures, m.WorkflowErrors)
	return m
}

// Enqueued counts n enrollments whose enqueue ended in outcome.
func (m *MDM) Enqueued(outcome string, n int) {
	if m != nil && n > 0 {
		m.Enqueues.WithLabelValues(outcome).Add(float64(n))
	}
}

// PushFailed counts n enrollments whose push failed.
func (m *MDM) PushFailed(n int) {
	if m != nil && n > 0 {
		m.PushFailures.Add(float64(n))
	}
}

// WorkflowFailed counts a stored result whose workflow failed after it.
func (m *MDM) WorkflowFailed(workflow string) {
	if m != nil {
		m.WorkflowErrors.WithLabelValues(workflow).Inc()
	}
}
