package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/config"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

// APIConfig is cmd/api's configuration.
type APIConfig struct {
	MySQLDSN string
	RedisURL string
	Migrate  bool
	Listen   string
	// MetricsListen, when set, serves /metrics there alone (the main
	// listener then answers 404 for it); empty: on Listen.
	MetricsListen string
	// WorkerMetricsListen is STEPCOLLECT_METRICS_LISTEN, the worker's
	// setting, where the api's environment has it and no -metrics-listen
	// of its own: NewAPI says once that it does not move /metrics.
	WorkerMetricsListen string
	APIKey              string
	WebhookHMACKey      string
	MaxBodyBytes        int64
	LogLevel            string
	LogFormat           string
	// MySQLPool is the connection pool (zero value: 64 connections, none
	// closed for age or idleness; the flags' defaults are DefaultPool's).
	MySQLPool stepmysql.Pool
	// MySQLTryTimeout bounds each try of a transaction (-mysql-try-timeout;
	// 0 is the default, 10 s; negative is no bound).
	MySQLTryTimeout time.Duration
	// MySQLMaxActiveResults bounds the webhook's results in a transaction
	// at once (-mysql-max-active-results; 0 is the default, 64).
	MySQLMaxActiveResults int
	// MaxInflightBodyBytes bounds the working memory of bodies being read
	// and decoded at once (default httpapi.DefaultMaxInflightBodyBytes).
	MaxInflightBodyBytes int64
	// MaxStepIDs, MaxStepCommands and MaxStepRows bound one POST /v1/steps
	// (defaults httpapi.DefaultMaxStep*).
	MaxStepIDs, MaxStepCommands, MaxStepRows int
	// DumpWebhook writes every webhook body to standard output.
	DumpWebhook bool
	// DefaultStepTimeout is the timeout of a step posted without one
	// (default 72h, NanoCMD's; 0: none).
	DefaultStepTimeout time.Duration
}

// ParseAPIConfig reads the API's flags, with environment fallbacks.
func ParseAPIConfig(args []string, getenv func(string) string) (APIConfig, *config.Set, error) {
	s := config.New("api", getenv)
	common := addCommonFlags(s)
	listen := s.String("listen", "STEPCOLLECT_LISTEN", "127.0.0.1:9100", "address for the webhook, /v1, health and /metrics")
	// Not STEPCOLLECT_METRICS_LISTEN: that is the worker's, and make run,
	// an env file or a test's environment gives both binaries the same
	// variables; read by the api too, it took the worker's port from it
	// (the second to start could not bind) and moved /metrics off -listen.
	metricsListen := s.String("metrics-listen", "STEPCOLLECT_API_METRICS_LISTEN", "",
		"address for /metrics alone, which -listen then does not serve; none: /metrics on -listen")
	dumpWebhook := s.Bool("dump-webhook", "STEPCOLLECT_DUMP_WEBHOOK", false, "write every webhook body as received to standard output, one per line (NanoCMD's -dump-webhook); it carries device data")
	apiKey := s.Secret("api-key", "STEPCOLLECT_API_KEY", "API key for /v1/* (Bearer, or basic-auth password); none: /v1 answers 401")
	hmacKey := s.Secret("webhook-hmac-key", "STEPCOLLECT_WEBHOOK_HMAC_KEY", "NanoMDM's -webhook-hmac-key; none: webhook bodies are not verified")
	maxBody := s.Int("max-body-bytes", "STEPCOLLECT_MAX_BODY_BYTES", httpapi.DefaultMaxBody, "largest request body accepted (413 above)")
	inflight := s.Int("max-inflight-body-bytes", "STEPCOLLECT_MAX_INFLIGHT_BODY_BYTES", httpapi.DefaultMaxInflightBodyBytes,
		"working memory of the webhook and /v1/steps bodies read and decoded at once; more requests wait (at least -max-body-bytes)")
	maxActive := s.Int("mysql-max-active-results", "STEPCOLLECT_MYSQL_MAX_ACTIVE_RESULTS", stepmysql.DefaultMaxActiveResults,
		"most webhook results in a transaction at once; the rest wait their turn (far more than the database server has cores only slows each one)")
	stepIDs := s.Int("max-step-ids", "STEPCOLLECT_MAX_STEP_IDS", httpapi.DefaultMaxStepIDs, "most ids in one POST /v1/steps (413 above)")
	stepCommands := s.Int("max-step-commands", "STEPCOLLECT_MAX_STEP_COMMANDS", httpapi.DefaultMaxStepCommands, "most commands in one POST /v1/steps (413 above)")
	stepRows := s.Int("max-step-rows", "STEPCOLLECT_MAX_STEP_ROWS", httpapi.DefaultMaxStepRows, "most ids x commands in one POST /v1/steps (413 above)")
	stepTimeout := s.Duration("default-step-timeout", "STEPCOLLECT_DEFAULT_STEP_TIMEOUT", DefaultStepTimeout,
		"timeout of a POST /v1/steps without one, from its not_until or from now (then step.timed_out); 0: none")
	s.Check(config.ListenAddr("listen", listen))
	s.Check(func() error {
		if *metricsListen == "" {
			return nil
		}
		return config.ListenAddr("metrics-listen", metricsListen)()
	})
	s.Check(func() error {
		if *maxBody < 1024 {
			return fmt.Errorf("-max-body-bytes: %d is too small for an MDM result", *maxBody)
		}
		return nil
	})
	s.Check(func() error {
		if *inflight < *maxBody {
			return fmt.Errorf("-max-inflight-body-bytes: %d is less than -max-body-bytes (%d), so the largest body could never be read", *inflight, *maxBody)
		}
		return nil
	})
	for _, f := range []struct {
		name string
		v    *int
	}{{"max-step-ids", stepIDs}, {"max-step-commands", stepCommands}, {"max-step-rows", stepRows}, {"mysql-max-active-results", maxActive}} {
		s.Check(func() error {
			if *f.v < 1 {
				return fmt.Errorf("-%s: %d is less than 1", f.name, *f.v)
			}
			return nil
		})
	}
	if err := s.Parse(args); err != nil {
		return APIConfig{}, s, err
	}
	var workerMetrics string
	if *metricsListen == "" {
		workerMetrics = getenv("STEPCOLLECT_METRICS_LISTEN")
	}
	return APIConfig{
		MySQLDSN: *common.dsn, RedisURL: *common.redis, Migrate: *common.migrate, Listen: *listen, MetricsListen: *metricsListen, DumpWebhook: *dumpWebhook, APIKey: *apiKey,
		WebhookHMACKey: *hmacKey, MaxBodyBytes: int64(*maxBody), MaxInflightBodyBytes: int64(*inflight),
		MaxStepIDs: *stepIDs, MaxStepCommands: *stepCommands, MaxStepRows: *stepRows, DefaultStepTimeout: *stepTimeout,
		LogLevel: *common.level, LogFormat: *common.format, MySQLPool: common.pool(), MySQLTryTimeout: common.tryTimeoutConfig(),
		MySQLMaxActiveResults: *maxActive, WorkerMetricsListen: workerMetrics,
	}, s, nil
}

// DefaultStepTimeout is -default-step-timeout's default: NanoCMD's three
// days, so that no step waits for ever.
const DefaultStepTimeout = 72 * time.Hour

// requestTimeout bounds reading a request and writing its answer: a 32 MiB
// result over a slow link.
const requestTimeout = 2 * time.Minute

// API is the HTTP service: NanoMDM's webhook, the workflow engine's /v1,
// health and metrics, on one listener.
type API struct {
	cfg     APIConfig
	handoff *collector.Handoff
	ns      *tasks.Namespace
	logger  zerolog.Logger
	db      *sql.DB
	enq     *tasks.Enqueuer
	http    *http.Server
	ln      net.Listener
	// metricsHTTP serves /metrics on metricsLn when -metrics-listen is set
	metricsHTTP *http.Server
	metricsLn   net.Listener
	// errc has what Serve returned, for each server: they serve from
	// NewAPI on, answering as a process starting while MySQL does not
	errc chan error
}

// NewAPI binds and serves the listeners (startGate), connects to MySQL
// (waiting for it: waitForMySQL, /readyz saying why meanwhile), migrating
// it if configured, and hands the listeners to the real handler. Redis
// need not be up: results are committed without it.
func NewAPI(ctx context.Context, cfg APIConfig, logger zerolog.Logger) (_ *API, err error) {
	a := &API{cfg: cfg, logger: logger, errc: make(chan error, 2)}
	if a.ln, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("-listen: %w", err)
	}
	if cfg.WorkerMetricsListen != "" {
		logger.Info().Str("STEPCOLLECT_METRICS_LISTEN", cfg.WorkerMetricsListen).Str("listen", cfg.Listen).
			Msg("STEPCOLLECT_METRICS_LISTEN is the worker's; the api serves /metrics on -listen (-metrics-listen or STEPCOLLECT_API_METRICS_LISTEN moves it)")
	}
	if cfg.MetricsListen != "" {
		if a.metricsLn, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			a.ln.Close()
			return nil, fmt.Errorf("-metrics-listen: %w", err)
		}
	}
	gate, metricsGate := newStartGate(logger), newStartGate(logger)
	a.http = &http.Server{
		Handler:           gate,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       requestTimeout,
		WriteTimeout:      requestTimeout,
		IdleTimeout:       2 * time.Minute,
	}
	go func() { a.errc <- a.http.Serve(a.ln) }()
	if a.metricsLn != nil {
		a.metricsHTTP = &http.Server{Handler: metricsGate, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
		go func() { a.errc <- a.metricsHTTP.Serve(a.metricsLn) }()
	}
	d, err := openDeps(ctx, cfg.RedisURL, cfg.MySQLDSN, cfg.MySQLPool, cfg.MySQLTryTimeout, cfg.MySQLMaxActiveResults, cfg.Migrate, true, logger,
		func(why string) { gate.wait(why); metricsGate.wait(why) })
	if err != nil {
		a.http.Close()
		if a.metricsHTTP != nil {
			a.metricsHTTP.Close()
		}
		return nil, err
	}
	a.db, a.enq, a.handoff, a.ns = d.db, d.enq, d.handoff, d.ns
	m := d.metrics
	// without a Gatherer the main handler has no /metrics route (404)
	var mainGatherer prometheus.Gatherer = m.Registry
	if cfg.MetricsListen != "" {
		mainGatherer = nil
	}
	var dump io.Writer
	if cfg.DumpWebhook {
		dump = os.Stdout
	}
	gate.open(httpapi.New(httpapi.Config{
		DumpWebhook:          dump,
		Store:                d.store,
		Logger:               logger.With().Str("component", "http").Logger(),
		APIKey:               cfg.APIKey,
		WebhookHMACKey:       []byte(cfg.WebhookHMACKey),
		MaxBody:              cfg.MaxBodyBytes,
		MaxInflightBodyBytes: cfg.MaxInflightBodyBytes,
		// A request that waited for the body budget gets the server's
		// timeouts again from when it has its share.
		BodyTimeout:        requestTimeout,
		MaxStepIDs:         cfg.MaxStepIDs,
		MaxStepCommands:    cfg.MaxStepCommands,
		MaxStepRows:        cfg.MaxStepRows,
		DefaultStepTimeout: cfg.DefaultStepTimeout,
		Ready:              readyChecks(d.db, d.enq, false, d.secrets),
		Metrics:            m.API,
		Gatherer:           mainGatherer,
	}))
	if a.metricsLn != nil {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
		metricsGate.open(mux)
	}
	return a, nil
}

// MetricsAddr is the address of the -metrics-listen listener, "" without one.
func (a *API) MetricsAddr() string {
	if a.metricsLn == nil {
		return ""
	}
	return a.metricsLn.Addr().String()
}

// Addr is the address the API listens on (useful with port 0).
func (a *API) Addr() string { return a.ln.Addr().String() }

// Run serves until ctx ends, then stops accepting and lets requests in
// flight finish their commits (up to 30 s).
func (a *API) Run(ctx context.Context) error {
	defer a.db.Close()
	defer a.enq.Close()
	// The hand-off outlives the listener: what the last requests released
	// is enqueued after they are answered.
	hctx, stopHandoff := context.WithCancel(context.WithoutCancel(ctx))
	go a.handoff.Run(hctx)
	// on a database not migrated yet (-migrate=false) the queues' names
	// come once it is; the hand-off keeps what it cannot enqueue meanwhile
	go awaitNamespace(ctx, a.db, a.ns, a.logger)
	defer func() { stopHandoff(); <-a.handoff.Done() }()
	metricsURL := "http://" + a.Addr() + "/metrics"
	if a.metricsHTTP != nil {
		metricsURL = "http://" + a.MetricsAddr() + "/metrics"
	}
	a.logger.Info().Str("listen", "http://"+a.Addr()).Str("metrics", metricsURL).Bool("api_key_set", a.cfg.APIKey != "").
		Bool("webhook_hmac", a.cfg.WebhookHMACKey != "").Msg("api started: POST /webhook, /v1/*, /metrics")
	select {
	case err := <-a.errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	a.logger.Info().Msg("api stopping")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.http.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("stopping: %w", err)
	}
	if a.metricsHTTP != nil {
		a.metricsHTTP.Close() // scrapes need no draining
	}
	a.logger.Info().Msg("api stopped")
	return nil
}
