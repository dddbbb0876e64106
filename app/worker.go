package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/delivery"
	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/internal/logging"
	"github.com/stepcollect/stepcollect/scheduler"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

// WorkerConfig is cmd/worker's configuration.
type WorkerConfig struct {
	MySQLDSN      string
	RedisURL      string
	Migrate       bool
	MetricsListen string
	Concurrency   int
	SweepInterval time.Duration
	// ScheduleInterval is how often timeouts and NotUntil are acted on.
	ScheduleInterval time.Duration
	CallbackURL      string
	CallbackHMACKey  string
	LogLevel         string
	LogFormat        string
	// ShutdownTimeout is how long in-flight tasks get to finish on stop.
	ShutdownTimeout time.Duration
	// MySQLPool is the connection pool (zero value: 64 connections, none
	// closed for age or idleness; the flags' defaults are DefaultPool's).
	MySQLPool stepmysql.Pool
	// MySQLTryTimeout bounds each try of a transaction (-mysql-try-timeout;
	// 0 is the default, 10 s; negative is no bound).
	MySQLTryTimeout time.Duration
	// MaxDeliveryAttempts and MaxDeliveryAge hold an event that failed
	// that often, or is that old, for an operator; 0: no limit.
	MaxDeliveryAttempts int
	MaxDeliveryAge      time.Duration
	// MaxDeliveryInflight is the most POSTs to the receiver this worker has
	// in flight at once (-max-delivery-inflight); 0: the default, 256.
	MaxDeliveryInflight int
	// PushURL is NanoMDM's push API (…/v1/push/), PushAPIKey its key;
	// without a URL, or with RePushInterval 0, nothing is re-pushed.
	PushURL        string
	PushAPIKey     string
	RePushInterval time.Duration
}

// ParseWorkerConfig reads the worker's flags, with environment fallbacks.
func ParseWorkerConfig(args []string, getenv func(string) string) (WorkerConfig, *config.Set, error) {
	var c WorkerConfig
	s := config.New("worker", getenv)
	common := addCommonFlags(s)
	listen := s.String("metrics-listen", "STEPCOLLECT_METRICS_LISTEN", "127.0.0.1:9101", "address for /metrics, /healthz and /readyz")
	conc := s.Int("concurrency", "STEPCOLLECT_CONCURRENCY", 4*runtime.NumCPU(), "tasks processed at once (collection waits on MySQL, not CPU)")
	sweep := s.Duration("sweep-interval", "STEPCOLLECT_SWEEP_INTERVAL", 30*time.Second, "time between sweeps across all replicas; 0 disables the sweeper")
	schedule := s.Duration("schedule-interval", "STEPCOLLECT_SCHEDULE_INTERVAL", 10*time.Second, "how often step timeouts and not_until are acted on, across all replicas; 0 disables")
	callback := s.URL("callback-url", "STEPCOLLECT_CALLBACK_URL", "", "where events are POSTed; none: events wait in the outbox")
	callbackKey := s.Secret("callback-hmac-key", "STEPCOLLECT_CALLBACK_HMAC_KEY", "signs each callback body (X-Stepcollect-Signature)")
	maxAttempts := s.Int("max-delivery-attempts", "STEPCOLLECT_MAX_DELIVERY_ATTEMPTS", delivery.DefaultMaxDeliveryAttempts,
		"failed tries after which an event is held until an operator releases it (tries come 5-10s apart at the backoff cap: the default lasts 2.8-5.6 hours); 0: never")
	maxAge := s.Duration("max-delivery-age", "STEPCOLLECT_MAX_DELIVERY_AGE", delivery.DefaultMaxDeliveryAge,
		"age (since written or released) after which an event whose try fails is held until an operator releases it; 0: never")
	inflight := s.Int("max-delivery-inflight", "STEPCOLLECT_MAX_DELIVERY_INFLIGHT", delivery.DefaultMaxInflight,
		"the most POSTs to -callback-url this worker has in flight at once (and connections open to it); lower it for a receiver that cannot take as many, each worker replica adding its own")
	pushURL := s.URL("push-url", "STEPCOLLECT_PUSH_URL", "",
		"NanoMDM's push API (like http://nanomdm:9000/v1/push/), where enrollments that have not answered are re-pushed; none: no re-push")
	pushKey := s.Secret("push-api-key", "STEPCOLLECT_PUSH_API_KEY", "NanoMDM's API key, sent as HTTP basic auth nanomdm:<key> to -push-url")
	repush := s.Duration("repush-interval", "STEPCOLLECT_REPUSH_INTERVAL", 24*time.Hour,
		"how long a command goes unanswered before its enrollment is pushed again through -push-url (NanoCMD's default); 0 disables")
	s.Check(config.ListenAddr("metrics-listen", listen))
	s.Check(scheduler.CheckPushURL("push-url", pushURL))
	s.Check(config.HTTPURL("callback-url", callback))
	s.Check(func() error {
		if *conc < 1 {
			return fmt.Errorf("-concurrency: %d is less than 1", *conc)
		}
		if *pushURL != "" && *pushKey == "" {
			// NanoMDM serves its API only with a key: every push would be a 401
			return errors.New("-push-api-key: required with -push-url (NanoMDM's API key)")
		}
		if *maxAttempts < 0 {
			return fmt.Errorf("-max-delivery-attempts: %d is negative (0 holds no event for its attempts)", *maxAttempts)
		}
		if *inflight < 1 {
			return fmt.Errorf("-max-delivery-inflight: %d is less than 1", *inflight)
		}
		return nil
	})
	if err := s.Parse(args); err != nil {
		return c, s, err
	}
	return WorkerConfig{
		MySQLDSN: *common.dsn, RedisURL: *common.redis, Migrate: *common.migrate, MetricsListen: *listen,
		Concurrency: *conc, SweepInterval: *sweep, ScheduleInterval: *schedule, CallbackURL: *callback,
		CallbackHMACKey: *callbackKey, LogLevel: *common.level, LogFormat: *common.format, MySQLPool: common.pool(), MySQLTryTimeout: common.tryTimeoutConfig(),
		ShutdownTimeout: 8 * time.Second, MaxDeliveryAttempts: *maxAttempts, MaxDeliveryAge: *maxAge,
		MaxDeliveryInflight: *inflight, PushURL: *pushURL, PushAPIKey: *pushKey, RePushInterval: *repush,
	}, s, nil
}

// Worker is the asynq server that collects steps, the outbox's dispatcher
// that delivers events, and the tickers of the sweeper and the scheduler.
type Worker struct {
	cfg        WorkerConfig
	redisOpt   asynq.RedisConnOpt
	logger     zerolog.Logger
	db         *sql.DB
	store      *stepmysql.Storage
	enq        *tasks.Enqueuer
	ns         *tasks.Namespace
	srv        *asynq.Server // collection, sweeps, schedules; made once ns is known
	mux        *asynq.ServeMux
	sweeper    *collector.Sweeper
	dispatcher *delivery.Dispatcher
	scheduler  *scheduler.Scheduler
	http       *http.Server // serving from NewWorker on (startGate)
	ln         net.Listener
	httpErr    chan error // what http's Serve returned
}

// NewWorker binds and serves the metrics listener (startGate), connects
// to MySQL (waiting for it: waitForMySQL, /readyz saying why meanwhile),
// migrating it if configured, and prepares the asynq server. Redis need
// not be up yet.
func NewWorker(ctx context.Context, cfg WorkerConfig, logger zerolog.Logger) (*Worker, error) {
	ln, err := net.Listen("tcp", cfg.MetricsListen)
	if err != nil {
		return nil, fmt.Errorf("-metrics-listen: %w", err)
	}
	gate := newStartGate(logger)
	w := &Worker{cfg: cfg, logger: logger, ln: ln, httpErr: make(chan error, 1),
		http: &http.Server{Handler: gate, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}}
	go func() { w.httpErr <- w.http.Serve(ln) }()
	d, err := openDeps(ctx, cfg.RedisURL, cfg.MySQLDSN, cfg.MySQLPool, cfg.MySQLTryTimeout, 0, cfg.Migrate, false, logger, gate.wait)
	if err != nil {
		w.http.Close()
		return nil, err
	}
	redisOpt, m, enq, db, store := d.redisOpt, d.metrics, d.enq, d.db, d.store
	w.redisOpt, w.db, w.store, w.enq, w.ns = redisOpt, db, store, enq, d.ns
	// Events are offered by the dispatcher, which polls the outbox; the
	// sweeper only counts them.
	w.sweeper = collector.NewSweeper(collector.SweeperConfig{Interval: cfg.SweepInterval},
		store, enq, m.Sweeper, logger.With().Str("component", "sweeper").Logger())
	var schedOpts []scheduler.Option
	if cfg.PushURL != "" {
		pusher := scheduler.NewPusher(cfg.PushURL, cfg.PushAPIKey, m.RePush, logger.With().Str("component", "repush").Logger())
		schedOpts = append(schedOpts, scheduler.WithRePush(scheduler.RePush{Interval: cfg.RePushInterval, Store: store, Pusher: pusher}))
	}
	w.scheduler = scheduler.New(cfg.ScheduleInterval, store, enq, logger.With().Str("component", "scheduler").Logger(), schedOpts...)

	w.mux = asynq.NewServeMux()
	w.mux.Handle(tasks.TypeCollect, collector.NewHandler(store, logger.With().Str("component", "collector").Logger()))
	w.mux.Handle(tasks.TypeSweep, w.sweeper)
	w.mux.Handle(tasks.TypeSchedule, w.scheduler)

	deliverer := delivery.New(delivery.Config{URL: cfg.CallbackURL, HMACKey: []byte(cfg.CallbackHMACKey)},
		m.Delivery, logger.With().Str("component", "delivery").Logger())
	w.dispatcher = delivery.NewDispatcher(delivery.DispatchConfig{Drain: cfg.ShutdownTimeout,
		MaxAttempts: cfg.MaxDeliveryAttempts, MaxAge: cfg.MaxDeliveryAge, MaxInflight: cfg.MaxDeliveryInflight}, deliverer, store)

	hm := http.NewServeMux()
	hm.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry}))
	hm.HandleFunc("GET /version", httpapi.VersionHandler)
	hm.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
	hm.HandleFunc("GET /readyz", httpapi.ReadyHandler(append(readyChecks(db, enq, true, d.secrets), deliveryReport(store, d.secrets))))
	gate.open(hm)
	return w, nil
}

// MetricsAddr is the address /metrics is served on (useful with port 0).
func (w *Worker) MetricsAddr() string { return w.ln.Addr().String() }

// Run processes tasks and sweeps until ctx ends, then stops: in-flight tasks
// get ShutdownTimeout to finish (their context is cancelled after that and
// asynq hands them back to the queue).
func (w *Worker) Run(ctx context.Context) error {
	defer w.close()
	// The queues are named by the deployment's database: on one not
	// migrated yet (-migrate=false) the worker waits, /readyz saying why.
	if err := awaitNamespace(ctx, w.db, w.ns, w.logger); err != nil {
		return w.stopHTTP(nil)
	}
	w.srv = asynq.NewServer(w.redisOpt, asynqConfig(w.cfg, w.ns.Names().Priorities(), w.logger.With().Str("component", "asynq").Logger()))
	if err := w.srv.Start(w.mux); err != nil {
		return fmt.Errorf("starting asynq server: %w", err)
	}
	const nTickers = 5 // the goroutines below, each waited for at the stop
	tickers := make(chan struct{}, nTickers)
	go func() { w.sweeper.SweepAtStart(ctx); w.sweeper.Run(ctx); tickers <- struct{}{} }()
	go func() { w.sweeper.SweepOnQueueLoss(ctx, w.redisOpt, w.ns.Names().Marker); tickers <- struct{}{} }()
	go func() { w.sweeper.SweepOnServerChange(ctx, w.store); tickers <- struct{}{} }()
	go func() { w.scheduler.Run(ctx); tickers <- struct{}{} }()
	go func() { w.dispatcher.Run(ctx); tickers <- struct{}{} }()
	callback := config.RedactURL(w.cfg.CallbackURL)
	if callback == "" {
		callback = "none: events wait in the outbox"
	}
	push := config.RedactURL(w.cfg.PushURL)
	if push == "" {
		push = "none: no re-push"
	}
	w.logger.Info().Str("metrics", "http://"+w.MetricsAddr()+"/metrics").Int("concurrency", w.cfg.Concurrency).
		Str("collect_queue", w.ns.Names().Collect).
		Stringer("sweep_interval", w.cfg.SweepInterval).Stringer("schedule_interval", w.cfg.ScheduleInterval).
		Str("callback_url", callback).Int("max_delivery_attempts", w.cfg.MaxDeliveryAttempts).
		Str("max_delivery_age", w.cfg.MaxDeliveryAge.String()).Int("max_delivery_inflight", w.dispatcher.MaxInflight()).Str("push_url", push).
		Str("repush_interval", w.cfg.RePushInterval.String()).Msg("worker started")

	var err error
	select {
	case <-ctx.Done():
	case err = <-w.httpErr:
		err = fmt.Errorf("metrics server: %w", err)
	}
	w.logger.Info().Msg("worker stopping")
	w.srv.Shutdown()
	for range nTickers {
		<-tickers
	}
	return w.stopHTTP(err)
}

// stopHTTP stops the metrics listener and returns err.
func (w *Worker) stopHTTP(err error) error {
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	w.http.Shutdown(shutdownCtx)
	w.logger.Info().Msg("worker stopped")
	return err
}

// deliveryReport puts whether an operator paused delivery in /readyz's
// body. A paused worker is still ready: it does its other work, and
// pulling it would not resume anything.
func deliveryReport(store *stepmysql.Storage, secrets []string) httpapi.Check {
	return httpapi.Check{Name: "delivery", Report: func(ctx context.Context) string {
		st, err := store.DeliveryState(ctx)
		switch {
		case err != nil:
			return "unknown: " + config.RedactError(err, secrets...).Error()
		case st.Paused && st.Since != nil:
			return "paused since " + st.Since.Format(time.RFC3339) + " (POST /v1/delivery/resume on the api)"
		case st.Paused:
			return "paused (POST /v1/delivery/resume on the api)"
		}
		return "running"
	}}
}

// asynqConfig is an asynq server's configuration for queues.
func asynqConfig(cfg WorkerConfig, queues map[string]int, logger zerolog.Logger) asynq.Config {
	return asynq.Config{
		Concurrency:     cfg.Concurrency,
		Queues:          queues,
		ShutdownTimeout: cfg.ShutdownTimeout,
		RetryDelayFunc:  tasks.RetryDelay,
		// how often an idle server looks for new tasks (asynq's default
		// is 1 s): collection lag is mostly this wait
		TaskCheckInterval: 200 * time.Millisecond,
		// how often retries and delayed tasks become pending (asynq's
		// default is 5 s): a collect task failed by a MySQL outage runs
		// again within its retry delay plus this once MySQL answers
		DelayedTaskCheckInterval: time.Second,
		Logger:                   logging.NewAsynq(logger),
		LogLevel:                 asynqLevel(logger.GetLevel()),
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			logger.Debug().Err(err).Str("task", t.Type()).Msg("task failed; asynq retries it")
		}),
		HealthCheckFunc: func(err error) {
			if err != nil {
				logger.Warn().Err(err).Msg("redis health check failed")
			}
		},
	}
}

func (w *Worker) close() {
	w.enq.Close()
	w.db.Close()
}

func asynqLevel(l zerolog.Level) asynq.LogLevel {
	switch {
	case l <= zerolog.DebugLevel:
		return asynq.DebugLevel
	case l == zerolog.InfoLevel:
		return asynq.InfoLevel
	case l == zerolog.WarnLevel:
		return asynq.WarnLevel
	default:
		return asynq.ErrorLevel
	}
}
