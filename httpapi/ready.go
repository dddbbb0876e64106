package httpapi

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/config"
)

// Check is one readiness dependency: a name ("mysql", "redis") and a probe.
type Check struct {
	Name  string
	Probe func(ctx context.Context) error
	// Informational checks are reported in /readyz's body but do not make
	// it fail: the api commits results without Redis, so a load balancer
	// must not pull it for a Redis outage.
	Informational bool
	// Report, set instead of Probe, describes a state that never fails
	// readiness ("delivery: paused since …").
	Report func(ctx context.Context) string
}

// MySQLCheck is the "mysql" check: ready, the storage's own (a ping, and
// on a Galera node whether it takes writes: stepmysql.Ready). What its
// error says of secrets (the DSN's password) is redacted before /readyz
// shows it.
func MySQLCheck(ready func(context.Context) error, secrets ...string) Check {
	return Check{Name: "mysql", Probe: func(ctx context.Context) error { return config.RedactError(ready(ctx), secrets...) }}
}

// RedisCheck is the "redis" check through ping, informational for a
// process that does its job while Redis is down; secrets as MySQLCheck's.
func RedisCheck(ping func() error, informational bool, secrets ...string) Check {
	return Check{Name: "redis", Probe: func(context.Context) error { return config.RedactError(ping(), secrets...) }, Informational: informational}
}

// ReadyHandler answers 200 when every required check passes, else 503
// naming each part that failed. The body lists every check, one line each
// ("mysql: ok", "redis: down: …"), informational ones included.
func ReadyHandler(checks []Check) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var b strings.Builder
		ready := true
		for _, c := range checks {
			if c.Report != nil {
				b.WriteString(c.Name + ": " + oneLine(c.Report(ctx)) + "\n")
				continue
			}
			err := c.Probe(ctx)
			switch {
			case err == nil:
				b.WriteString(c.Name + ": ok\n")
			case c.Informational:
				b.WriteString(c.Name + ": down (not needed to be ready): " + oneLine(err.Error()) + "\n")
			default:
				ready = false
				b.WriteString(c.Name + ": " + oneLine(err.Error()) + "\n")
			}
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ready {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		w.Write([]byte(b.String()))
	}
}

// Starting is what a service's listener answers while the process waits
// for MySQL at start (why says what it waits for): /healthz 200 (the
// process runs), /version, /readyz 503 "mysql: starting: <why>", and any
// other request a JSON 503 saying nothing was written, each with its
// request id and access log line as once started (a webhook refused so is
// a lost result, logged at warn).
func Starting(logger zerolog.Logger, why func() string) http.Handler {
	return withRequest(logger, 1<<20, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			w.WriteHeader(http.StatusOK)
		case "/version":
			VersionHandler(w, r)
		case "/readyz":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("mysql: starting: " + oneLine(why()) + "\n"))
		default:
			w.Header().Set("Retry-After", "5")
			writeError(w, r, http.StatusServiceUnavailable, "starting: "+oneLine(why())+"; nothing was written")
		}
	}))
}
