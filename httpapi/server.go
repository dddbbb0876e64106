// Package httpapi is stepcollect's HTTP interface (docs/reference.md, "HTTP API"): the
// MDM server's webhook in, the workflow engine's /v1 API, health and
// metrics. Handlers are small: decode, act through the storage, map the
// error to a status in one place, log with the request's logger.
package httpapi

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
)

// Store is what the HTTP API needs of the storage.
type Store interface {
	StepOperator
	EventStore
	StoreCommandResponseAndRetrieveCompletedStep(ctx context.Context, id string, sc *nanostorage.StepCommandResult) (*nanostorage.StepResult, error)
	CancelSteps(ctx context.Context, id, workflowName string) error
	StoreStepID(ctx context.Context, step *nanostorage.StepEnqueuingWithConfig, pushTime time.Time) (int64, error)
	StepStatus(ctx context.Context, id int64) (*storage.StepStatus, error)
}

// Config configures the handler.
type Config struct {
	Store  Store
	Logger zerolog.Logger
	// APIKey guards /v1/*. Empty: every /v1 request is refused (401).
	APIKey string
	// WebhookHMACKey, when set, is checked against X-Hmac-Signature.
	WebhookHMACKey []byte
	// MaxBody bounds a request body. Default 32 MiB.
	MaxBody int64
	// MaxInflightBodyBytes bounds the working memory of the webhook and
	// /v1/steps bodies being read and decoded at once: bodies still
	// arriving hold their size (half of it in all), whole bodies being
	// decoded and handled 5x theirs (all of it). No share is held for bytes
	// that have not arrived (body.go). Default 256 MiB; never less than
	// MaxBody.
	MaxInflightBodyBytes int64
	// BodyTimeout is the longest a body waits for its arrival share, and
	// how long a whole body has to be handled and answered (the server's
	// WriteTimeout, restarted so that waiting costs no result). Default 2
	// minutes.
	BodyTimeout time.Duration
	// BodyGrace and MinBodyRate (bytes per second) are how a body must
	// keep arriving once it is read: each read may end no later than
	// BodyGrace plus what has arrived at MinBodyRate, or the request gets
	// a 408. Defaults DefaultBodyGrace, DefaultMinBodyRate.
	BodyGrace   time.Duration
	MinBodyRate int64
	// MaxStepIDs, MaxStepCommands and MaxStepRows bound one POST /v1/steps:
	// its ids, its commands and ids x commands (413 above). Defaults
	// DefaultMaxStepIDs, DefaultMaxStepCommands, DefaultMaxStepRows.
	MaxStepIDs, MaxStepCommands, MaxStepRows int
	// DumpWebhook, when set, gets every webhook body as received, one per
	// line (NanoCMD's -dump-webhook), before it is checked or decoded.
	DumpWebhook io.Writer
	// DefaultStepTimeout is the timeout POST /v1/steps gives a step whose
	// body has none, counted from its not_until or from now; 0: none.
	DefaultStepTimeout time.Duration
	// Ready lists what /readyz checks.
	Ready []Check
	// Metrics is the API's metrics; Gatherer serves /metrics.
	Metrics  *metrics.API
	Gatherer prometheus.Gatherer
}

// DefaultMaxBody is the default request body limit: MDM results (a profile
// list, an installed application list) can be large.
const DefaultMaxBody = 32 << 20

// DefaultMaxInflightBodyBytes is the default budget of body working memory:
// a few of the largest results at once, thousands of ordinary ones.
const DefaultMaxInflightBodyBytes = 256 << 20

// DefaultBodyTimeout is the default BodyTimeout: a 32 MiB result over a
// slow link.
const DefaultBodyTimeout = 2 * time.Minute

// Server is the HTTP API.
type Server struct {
	cfg        Config
	dumpMu     sync.Mutex // one body per line however many arrive at once
	mux        *http.ServeMux
	cancelOne  http.Handler // DELETE /v1/enrollments/{id}/steps, for route
	unclean    http.Handler // a /v1 path with an empty, "." or ".." segment
	body       *bodyadmit.Admitter
	stepLimits stepLimits
}

// BodyBudget is the working memory of bodies read and decoded at once that
// the server admits with these limits (0: the default): at least one
// largest body.
func BodyBudget(maxBody, maxInflight int64) int64 {
	if maxBody <= 0 {
		maxBody = DefaultMaxBody
	}
	if maxInflight <= 0 {
		maxInflight = DefaultMaxInflightBodyBytes
	}
	return max(maxInflight, maxBody)
}

// New returns the API's handler.
func New(cfg Config) *Server {
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = DefaultMaxBody
	}
	cfg.MaxInflightBodyBytes = BodyBudget(cfg.MaxBody, cfg.MaxInflightBodyBytes)
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.BodyGrace <= 0 {
		cfg.BodyGrace = DefaultBodyGrace
	}
	if cfg.MinBodyRate <= 0 {
		cfg.MinBodyRate = DefaultMinBodyRate
	}
	lim := stepLimits{ids: cfg.MaxStepIDs, commands: cfg.MaxStepCommands, rows: cfg.MaxStepRows}
	if lim.ids <= 0 {
		lim.ids = DefaultMaxStepIDs
	}
	if lim.commands <= 0 {
		lim.commands = DefaultMaxStepCommands
	}
	if lim.rows <= 0 {
		lim.rows = DefaultMaxStepRows
	}
	var gauge prometheus.Gauge
	if cfg.Metrics != nil {
		gauge = cfg.Metrics.InflightBodyBytes
	}
	s := &Server{cfg: cfg, mux: http.NewServeMux(), stepLimits: lim, body: bodyadmit.New(bodyadmit.Config{
		MaxBody: cfg.MaxBody, Budget: cfg.MaxInflightBodyBytes, Timeout: cfg.BodyTimeout,
		Grace: cfg.BodyGrace, MinRate: cfg.MinBodyRate,
		BudgetName: "the in-flight body budget (-max-inflight-body-bytes)", Gauge: gauge,
	})}
	s.handle("POST /webhook", "webhook", s.browserless(s.withBody(s.webhook)))
	s.handle("/webhook", "webhook", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "POST")
		writeError(w, r, http.StatusMethodNotAllowed, "method "+oneLine(r.Method)+": the webhook takes POST")
	})
	s.handle("POST /v1/steps", "enqueue_step", s.auth(s.withBody(s.enqueueStep)))
	s.handle("GET /v1/steps/{step_id}", "step_status", s.auth(s.stepStatus))
	s.cancelOne = s.handle(cancelStepsPattern, "cancel_steps", s.auth(takes(s.cancelSteps, "workflow_name")))
	// Operators' step endpoints (operator_steps.go) and the version.
	s.handle("GET /v1/steps", "list_steps", s.auth(takes(s.listSteps, "workflow_name", "instance_id", "older_than", "limit", "after")))
	s.handle("GET /v1/steps/{step_id}/outstanding", "step_outstanding", s.auth(takes(s.stepOutstanding, "limit", "after")))
	s.handle("DELETE /v1/steps/{step_id}", "cancel_step", s.auth(s.cancelStep))
	s.handle("DELETE /v1/steps", "cancel_workflow_instance", s.auth(takes(s.cancelWorkflowInstance, "workflow_name", "instance_id")))
	s.handle("GET /version", "version", VersionHandler)
	s.registerOperatorEvents()
	s.handle("GET /ui/", "ui", s.auth(s.ui))
	s.handle("/v1/", "v1_other", s.auth(func(w http.ResponseWriter, r *http.Request) {
		if allow := s.allowed(r); len(allow) > 0 {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, r, http.StatusMethodNotAllowed, "method "+oneLine(r.Method)+": "+oneLine(r.URL.Path)+" takes "+strings.Join(allow, " or "))
			return
		}
		writeError(w, r, http.StatusNotFound, "no such endpoint: "+r.Method+" "+oneLine(r.URL.EscapedPath()))
	}))
	s.unclean = s.instrument("v1_other", s.auth(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusBadRequest, "path "+strconv.Quote(oneLine(r.URL.EscapedPath()))+
			` has an empty, "." or ".." segment, which this API neither cleans nor redirects: escape the dots and slashes of an id (%2E, %2F)`)
	}))
	// the rest: JSON, as every other refusal, not net/http's plain text
	s.handle("/", "other", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, r, http.StatusNotFound, "no such endpoint: "+oneLine(r.Method)+" "+oneLine(r.URL.EscapedPath()))
	})
	s.handle("GET /healthz", "healthz", func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })
	s.handle("GET /readyz", "readyz", ReadyHandler(cfg.Ready))
	if cfg.Gatherer != nil {
		s.mux.Handle("GET /metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	return s
}

// ServeHTTP implements http.Handler: request id, logger, body limit and
// panic recovery around every route.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	withRequest(s.cfg.Logger, s.cfg.MaxBody, http.HandlerFunc(s.route)).ServeHTTP(w, r)
}

// cancelStepsPattern is the route that cancels one enrollment's steps.
const cancelStepsPattern = "DELETE /v1/enrollments/{id}/steps"

// route is the mux, less two things it does with a path. It redirects a
// path that is not clean to its cleaned form (307, before any key is
// checked), which for the API is another endpoint: an enrollment id ".."
// written unescaped turns DELETE /v1/enrollments/../steps into DELETE
// /v1/steps. And it takes an unescaped "/" segment for its own
// trailing-slash marker, so an enrollment id of "/" (%2F) matched nothing
// and could be stored and never cancelled.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/v1/") {
		// an answer holds what the key may read: no cache keeps it, and a
		// browser reads it as the JSON it is
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("X-Content-Type-Options", "nosniff")
	}
	if p := r.URL.EscapedPath(); strings.HasPrefix(p, "/v1/") && !cleanPath(p) {
		s.unclean.ServeHTTP(w, r)
		return
	}
	if r.Method == http.MethodDelete && strings.EqualFold(r.URL.EscapedPath(), "/v1/enrollments/%2F/steps") {
		r.Pattern = cancelStepsPattern
		r.SetPathValue("id", "/")
		s.cancelOne.ServeHTTP(w, r)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// allowed lists the methods another /v1 route takes r's path with: the
// catch-all "/v1/" matches every method, so the mux never answers 405 for
// a path that exists (PUT /v1/steps/1) by itself.
func (s *Server) allowed(r *http.Request) []string {
	var allow []string
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		if m == r.Method {
			continue
		}
		probe := &http.Request{Method: m, URL: r.URL, Host: r.Host, Header: http.Header{}}
		if _, pattern := s.mux.Handler(probe); pattern != "" && pattern != "/v1/" {
			allow = append(allow, m)
		}
	}
	return allow
}

// cleanPath reports whether p is as ServeMux would clean it: no empty,
// "." or ".." segment (a trailing slash kept).
func cleanPath(p string) bool {
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c == p
}

func (s *Server) handle(pattern, name string, h http.HandlerFunc) http.Handler {
	handler := s.instrument(name, h)
	s.mux.Handle(pattern, handler)
	return handler
}

// instrument is h counted and timed under the route name.
func (s *Server) instrument(name string, h http.HandlerFunc) http.Handler {
	if s.cfg.Metrics != nil {
		return s.cfg.Metrics.InstrumentHandler(name, h)
	}
	return h
}

// auth requires the API key, as a Bearer token or as the basic-auth
// password with any user name (as NanoMDM and NanoCMD do).
func (s *Server) auth(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if refuseCrossSite(w, r) {
			return
		}
		if s.cfg.APIKey == "" {
			challenge(w)
			writeError(w, r, http.StatusUnauthorized, "no API key is configured on this server: set -api-key")
			return
		}
		var given string
		if _, pass, ok := r.BasicAuth(); ok {
			given = pass
		} else if h := r.Header.Get("Authorization"); len(h) > 7 && strings.EqualFold(h[:7], "Bearer ") { // schemes are case-insensitive (RFC 9110 11.1)
			given = h[7:]
		}
		if subtle.ConstantTimeCompare([]byte(given), []byte(s.cfg.APIKey)) != 1 {
			challenge(w)
			writeError(w, r, http.StatusUnauthorized, "missing or wrong API key (Authorization: Bearer <key>, or basic auth with the key as password)")
			return
		}
		// r.URL.Query drops a pair it cannot read: a cursor sent as
		// after=%zz would be read as no cursor, the first page again
		if _, err := url.ParseQuery(r.URL.RawQuery); err != nil {
			writeError(w, r, http.StatusBadRequest, "query: "+oneLine(err.Error()))
			return
		}
		next(w, r)
	}
}

// validHMAC checks NanoMDM's X-Hmac-Signature: standard base64 of
// HMAC-SHA256 over the exact body.
func validHMAC(key, body []byte, header string) bool {
	got, err := base64.StdEncoding.DecodeString(header)
	if err != nil || header == "" {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	return hmac.Equal(got, mac.Sum(nil))
}
