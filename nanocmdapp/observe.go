package nanocmdapp

import (
	"net/http"

	"github.com/alexedwards/flow"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/metrics"
)

// newRegistry is the registry /metrics serves, with what every stepcollect
// binary exports (the Go and process collectors, the build); the storage
// and the routes add theirs.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewBuildInfo(version.Get()))
	return reg
}

// opsPaths are served without the API key (load balancers and Prometheus
// have none) and without NanoCMD's request log line.
var opsPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// handleOps serves /healthz, /readyz (ready's checks) and /metrics (reg).
func handleOps(mux *flow.Mux, m *metrics.HTTP, reg *prometheus.Registry, ready []httpapi.Check) {
	healthz := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	mux.Handle("/healthz", m.InstrumentHandler("healthz", healthz), http.MethodGet)
	mux.Handle("/readyz", m.InstrumentHandler("readyz", httpapi.ReadyHandler(ready)), http.MethodGet)
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}), http.MethodGet)
}

// untraced serves opsPaths straight from mux and the rest through traced:
// NanoCMD logs every request at info, and a probe every few seconds would
// fill the log.
func untraced(mux, traced http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if opsPaths[r.URL.Path] {
			mux.ServeHTTP(w, r)
			return
		}
		traced.ServeHTTP(w, r)
	})
}
