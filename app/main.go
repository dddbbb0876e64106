package app

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/internal/logging"
	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/metrics"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

// commonFlags are the flags both binaries take.
type commonFlags struct {
	dsn, redis, level, format *string
	migrate                   *bool
	maxConns                  *int
}

func addCommonFlags(s *config.Set) *commonFlags {
	f := &commonFlags{
		dsn:      s.DSN("mysql-dsn", "STEPCOLLECT_MYSQL_DSN", DefaultMySQLDSN, "MySQL/MariaDB DSN (go-sql-driver form)"),
		redis:    s.URL("redis-url", "STEPCOLLECT_REDIS_URL", DefaultRedisURL, "Redis URL: redis://, rediss:// or redis-sentinel://"),
		migrate:  s.Bool("migrate", "STEPCOLLECT_MIGRATE", true, "apply the embedded schema migrations at start"),
		maxConns: s.Int("mysql-max-conns", "STEPCOLLECT_MYSQL_MAX_CONNS", 64, "most MySQL connections this process opens (every replica's count adds up against max_connections)"),
		level:    s.String("log-level", "STEPCOLLECT_LOG_LEVEL", "info", "debug, info, warn or error"),
		format:   s.String("log-format", "STEPCOLLECT_LOG_FORMAT", "json", "json, or console for people"),
	}
	// read back by run through the Set: GET this binary's own /readyz
	// (the container health check) instead of starting
	s.Switch("probe", "GET this binary's own /readyz (on -listen, or -metrics-listen) and exit 0 if it answers 200, else 1; starts nothing")
	s.Check(config.MySQLDSN("mysql-dsn", f.dsn))
	s.Check(config.RedisURL("redis-url", f.redis))
	s.Check(func() error {
		if *f.maxConns < 2 {
			return fmt.Errorf("-mysql-max-conns: %d is less than 2", *f.maxConns)
		}
		return nil
	})
	s.Check(func() error { _, err := logging.New(nil, *f.level, *f.format); return err })
	return f
}

// Service is what Main runs until a signal.
type Service interface {
	Run(ctx context.Context) error
}

// Main is all of cmd/api's and cmd/worker's main: parse the flags (exit 2
// with one line naming a bad one), build the logger, optionally profile
// (STEPCOLLECT_CPU_PROFILE), start the service and run it until SIGINT or
// SIGTERM.
func Main[C any](name string, parse func([]string, func(string) string) (C, *config.Set, error),
	logs func(C) (level, format string), start func(context.Context, C, zerolog.Logger) (Service, error)) {
	os.Exit(run(name, parse, logs, start))
}

// run is Main's body; its defers (the profile, the signal handler) run
// before Main exits with the code it returns.
func run[C any](name string, parse func([]string, func(string) string) (C, *config.Set, error),
	logs func(C) (level, format string), start func(context.Context, C, zerolog.Logger) (Service, error)) int {
	cfg, flags, err := parse(os.Args[1:], os.Getenv)
	if config.IsHelp(err) { // -h, or -version (Usage writes its line)
		flags.Usage(os.Stdout)
		return 0
	} else if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 2
	}
	if p, _ := flags.Lookup("probe"); p == "true" {
		return probe(flags, os.Stdout, os.Stderr)
	}
	level, format := logs(cfg)
	logger, _ := logging.New(os.Stderr, level, format)
	v := version.Get()
	logger.Info().Str("version", v.Version).Str("commit", v.Commit).Str("built", v.Date).Str("go_version", v.GoVersion).Msg(name + " starting")
	if path := os.Getenv("STEPCOLLECT_CPU_PROFILE"); path != "" {
		stop, err := logging.CPUProfile(path)
		if err != nil {
			logger.Error().Err(err).Msg("STEPCOLLECT_CPU_PROFILE")
			return 2
		}
		defer stop()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	svc, err := start(ctx, cfg, logger)
	if err != nil {
		logger.Error().Err(err).Msg(name + ": cannot start")
		return 1
	}
	if err := svc.Run(ctx); err != nil {
		logger.Error().Err(err).Msg(name + ": stopped with an error")
		return 1
	}
	return 0
}

// deps is what both services open first: Redis options, the metric set,
// the enqueuer, and the storage on its pool, all wired to one another.
type deps struct {
	redisOpt asynq.RedisConnOpt
	metrics  *metrics.Set
	enq      *tasks.Enqueuer
	handoff  *tasks.Handoff // the api's, nil in the worker
	db       *sql.DB
	store    *stepmysql.Storage
}

// openDeps opens them. With collectViaQueue the storage hands released
// steps to a Handoff (the api, where results arrive), which batches them
// onto the queue off the request path, instead of collecting them itself.
// Events are not handed anywhere: the worker's dispatcher polls the outbox.
func openDeps(ctx context.Context, redisURL, dsn string, maxConns int, migrate, collectViaQueue bool, logger zerolog.Logger) (*deps, error) {
	redisOpt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return nil, fmt.Errorf("-redis-url: %w", err)
	}
	redis.SetLogger(redisLogger{logger.With().Str("component", "redis").Logger()})
	d := &deps{redisOpt: redisOpt, metrics: newMetrics(redisOpt)}
	d.enq = tasks.NewEnqueuer(redisOpt, tasks.OnEnqueueFailure(d.metrics.Enqueue.Failed))
	opts := []stepmysql.Option{stepmysql.WithObserver(d.metrics.Storage), stepmysql.WithOutbox()}
	if collectViaQueue {
		d.handoff = tasks.NewHandoff(tasks.HandoffConfig{OnDrop: func(n int) { d.metrics.Enqueue.HandoffDropped.Add(float64(n)) }},
			d.enq, logger.With().Str("component", "handoff").Logger())
		opts = append(opts, stepmysql.WithCollector(d.handoff))
	}
	if d.db, d.store, err = openStorage(ctx, dsn, maxConns, migrate, logger, opts...); err != nil {
		d.enq.Close()
		return nil, err
	}
	d.metrics.RegisterDB(d.db)
	d.metrics.Up("mysql", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return d.db.PingContext(ctx)
	})
	d.metrics.Up("redis", d.enq.Ping)
	d.metrics.Registry.MustRegister(metrics.NewStateCollector(d.store.Gauges, 5*time.Second))
	return d, nil
}

func (d *deps) close() {
	d.enq.Close()
	d.db.Close()
}

// redisLogger routes go-redis's own messages (a Sentinel switching the
// primary, a bad pub/sub connection) into the JSON logs instead of
// standard error's plain text.
type redisLogger struct{ l zerolog.Logger }

func (r redisLogger) Printf(_ context.Context, format string, v ...any) {
	r.l.Info().Msg(fmt.Sprintf(format, v...))
}
