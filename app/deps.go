package app

// What both services open and check alike: the flags they share, Redis and
// the metric set, the storage on its pool (migrated if asked), and what
// /readyz asks. api.go and worker.go hold what is each one's own.

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/internal/logging"
	"github.com/stepcollect/stepcollect/metrics"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

// commonFlags are the flags both binaries take.
type commonFlags struct {
	dsn, redis, level, format *string
	migrate                   *bool
	maxConns                  *int
	connLifetime, connIdle    *time.Duration
	tryTimeout                *time.Duration
}

// tryTimeout is the -mysql-try-timeout flag as the configs take it: 0
// there is the default, so the flag's 0 (no bound) becomes -1.
func (f *commonFlags) tryTimeoutConfig() time.Duration {
	if *f.tryTimeout == 0 {
		return -1
	}
	return *f.tryTimeout
}

// pool is the connection pool the flags ask for.
func (f *commonFlags) pool() stepmysql.Pool {
	return stepmysql.Pool{MaxConns: *f.maxConns, MaxLifetime: *f.connLifetime, MaxIdleTime: *f.connIdle}
}

func addCommonFlags(s *config.Set) *commonFlags {
	f := &commonFlags{
		dsn:      s.DSN("mysql-dsn", "STEPCOLLECT_MYSQL_DSN", config.DefaultMySQLDSN, "MySQL/MariaDB DSN (go-sql-driver form)"),
		redis:    s.URL("redis-url", "STEPCOLLECT_REDIS_URL", config.DefaultRedisURL, "Redis URL: redis://, rediss:// or redis-sentinel://"),
		migrate:  s.Bool("migrate", "STEPCOLLECT_MIGRATE", true, "apply the embedded schema migrations at start"),
		maxConns: s.Int("mysql-max-conns", "STEPCOLLECT_MYSQL_MAX_CONNS", stepmysql.DefaultPoolSize, "most MySQL connections this process opens (every replica's count adds up against max_connections)"),
		connLifetime: s.Duration("mysql-conn-max-lifetime", "STEPCOLLECT_MYSQL_CONN_MAX_LIFETIME", stepmysql.DefaultConnMaxLifetime,
			"close a MySQL connection this long after it was opened, so a failover or a proxy's rebalancing reaches it; 0: never"),
		connIdle: s.Duration("mysql-conn-max-idle-time", "STEPCOLLECT_MYSQL_CONN_MAX_IDLE_TIME", stepmysql.DefaultConnMaxIdleTime,
			"give an idle MySQL connection back to the server after this long; 0: never"),
		tryTimeout: s.Duration("mysql-try-timeout", "STEPCOLLECT_MYSQL_TRY_TIMEOUT", stepmysql.DefaultAttemptTimeout,
			"longest one try of a transaction (or one statement outside one; storing a step: between two of its statements) may take before its connection is closed and it is tried again on a fresh one; 0 for no bound"),
		level:  s.String("log-level", "STEPCOLLECT_LOG_LEVEL", "info", "debug, info, warn or error"),
		format: s.String("log-format", "STEPCOLLECT_LOG_FORMAT", "json", "json, or console for people"),
	}
	// read back by run through the Set: GET this binary's own /readyz
	// (the container health check) instead of starting
	s.Switch("probe", "GET this binary's own /readyz (the api's -listen, the worker's -metrics-listen) and exit 0 if it answers 200, else 1; starts nothing")
	s.Check(config.MySQLDSN("mysql-dsn", f.dsn))
	s.Check(config.RedisURL("redis-url", f.redis, func(u string) error { _, err := asynq.ParseRedisURI(u); return err }))
	s.Check(func() error {
		if *f.maxConns < 2 {
			return fmt.Errorf("-mysql-max-conns: %d is less than 2", *f.maxConns)
		}
		return nil
	})
	s.Check(func() error {
		for name, d := range map[string]time.Duration{"mysql-conn-max-lifetime": *f.connLifetime, "mysql-conn-max-idle-time": *f.connIdle} {
			if d < 0 {
				return fmt.Errorf("-%s: %v is negative (0 for never)", name, d)
			}
		}
		return nil
	})
	s.Check(func() error {
		if *f.tryTimeout < 0 {
			return fmt.Errorf("-mysql-try-timeout: %v is negative (0 for no bound)", *f.tryTimeout)
		}
		return nil
	})
	s.Check(func() error { _, err := logging.New(nil, *f.level, *f.format); return err })
	return f
}

// deps is what both services open first: Redis options, the metric set,
// the enqueuer, and the storage on its pool, all wired to one another.
type deps struct {
	redisOpt asynq.RedisConnOpt
	ns       *tasks.Namespace // the deployment's queue names, once read
	metrics  *metrics.Set
	enq      *tasks.Enqueuer
	handoff  *collector.Handoff // the api's, nil in the worker
	db       *sql.DB
	store    *stepmysql.Storage
	secrets  []string // the DSN and the Redis URL, whose passwords no output shows
}

// openDeps opens them. With collectViaQueue the storage hands released
// steps to a Handoff (the api, where results arrive), which batches them
// onto the queue off the request path, instead of collecting them itself.
// Events are not handed anywhere: the worker's dispatcher polls the outbox.
//
// tryTimeout bounds each try (stepmysql.WithAttemptTimeout): 0 is the
// default, negative no bound. maxActiveResults bounds the results in a
// transaction at once (stepmysql.WithMaxActiveResults): 0 is the default.
func openDeps(ctx context.Context, redisURL, dsn string, pool stepmysql.Pool, tryTimeout time.Duration, maxActiveResults int, migrate, collectViaQueue bool, logger zerolog.Logger, report func(string)) (*deps, error) {
	redisOpt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return nil, fmt.Errorf("-redis-url: %w", config.RedactError(err, redisURL))
	}
	redis.SetLogger(redisLogger{logger.With().Str("component", "redis").Logger(), []string{redisURL, dsn}})
	d := &deps{redisOpt: redisOpt, ns: tasks.NewNamespace(tasks.QueueNames{})}
	d.metrics = newMetrics(redisOpt, d.ns)
	d.enq = tasks.NewEnqueuer(redisOpt, tasks.WithNamespace(d.ns), tasks.OnEnqueueFailure(d.metrics.Enqueue.Failed))
	opts := []stepmysql.Option{stepmysql.WithObserver(d.metrics.Storage), stepmysql.WithOutbox()}
	if tryTimeout != 0 {
		opts = append(opts, stepmysql.WithAttemptTimeout(max(tryTimeout, 0)))
	}
	if maxActiveResults > 0 {
		opts = append(opts, stepmysql.WithMaxActiveResults(maxActiveResults))
	}
	if collectViaQueue {
		d.handoff = collector.NewHandoff(collector.HandoffConfig{OnDrop: func(n int) { d.metrics.Enqueue.HandoffDropped.Add(float64(n)) }},
			d.enq, logger.With().Str("component", "handoff").Logger())
		opts = append(opts, stepmysql.WithReleaseSink(d.handoff))
	}
	if d.db, d.store, err = openStorage(ctx, dsn, pool, migrate, logger, report, opts...); err != nil {
		d.enq.Close()
		return nil, config.RedactError(err, dsn, redisURL)
	}
	d.secrets = []string{dsn, redisURL}
	if err := readNamespace(ctx, d.db, d.ns); err != nil && migrate {
		// migrated just now, so it is there: the database failed
		d.close()
		return nil, config.RedactError(fmt.Errorf("mysql: %w", err), dsn, redisURL)
	}
	// without -migrate on a database not migrated yet, the binaries wait
	// for it (awaitNamespace) while /readyz says why
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
type redisLogger struct {
	l       zerolog.Logger
	secrets []string
}

func (r redisLogger) Printf(_ context.Context, format string, v ...any) {
	r.l.Info().Msg(config.Redact(fmt.Sprintf(format, v...), r.secrets...))
}

// openStorage opens the pool, waits for MySQL to answer (waitForMySQL,
// each reason to wait going to report), migrates if asked, and returns
// the storage.
func openStorage(ctx context.Context, dsn string, pool stepmysql.Pool, migrate bool, logger zerolog.Logger, report func(string), opts ...stepmysql.Option) (*sql.DB, *stepmysql.Storage, error) {
	mysql.SetLogger(mysqlLogger{logger.With().Str("component", "mysql").Logger(), dsn})
	db, err := stepmysql.OpenDB(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("-mysql-dsn: %w", err)
	}
	pool.Apply(db)
	if err := waitForMySQL(ctx, db, dsn, migrate, logger, report); err != nil {
		db.Close()
		return nil, nil, fmt.Errorf("mysql (-mysql-dsn): %w", err)
	}
	if migrate {
		mctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		defer cancel()
		if err := stepmysql.Migrate(mctx, db); err != nil {
			db.Close()
			return nil, nil, err
		}
	}
	// READ COMMITTED comes with the session (OpenDB), not per transaction
	opts = append([]stepmysql.Option{stepmysql.WithDB(db), stepmysql.WithLogger(logger.With().Str("component", "storage").Logger())}, opts...)
	store, err := stepmysql.New(opts...)
	if err != nil {
		db.Close()
		return nil, nil, err
	}
	return db, store, nil
}

// errUnknownDatabase is MySQL's "Unknown database".
const errUnknownDatabase = 1049

// readyChecks are what /readyz asks: MySQL and Redis. The worker needs
// both; the api needs MySQL alone (it commits results while Redis is down,
// and its hand-off keeps what Redis cannot take yet), so for it Redis is
// informational. What a probe's error says of secrets (the DSN's and the
// Redis URL's passwords) is redacted before the body shows it.
func readyChecks(db *sql.DB, enq *tasks.Enqueuer, needRedis bool, secrets []string) []httpapi.Check {
	return []httpapi.Check{
		httpapi.MySQLCheck(stepmysql.ReadyCheck(db), secrets...),
		httpapi.RedisCheck(enq.Ping, !needRedis, secrets...),
	}
}

// newMetrics is the full metric set, with the deployment's queues (ns)
// read through a client that gives up quickly when Redis is down.
func newMetrics(redisOpt asynq.RedisConnOpt, ns *tasks.Namespace) *metrics.Set {
	return metrics.New(newQueueReader(redisOpt, ns), tasks.TaskTypes(), tasks.QueueLabels()...)
}

// mysqlLogger routes go-sql-driver's own messages (broken connections) to
// zerolog instead of the standard logger.
type mysqlLogger struct {
	l   zerolog.Logger
	dsn string
}

func (m mysqlLogger) Print(v ...any) { m.l.Warn().Msg(config.Redact(fmt.Sprint(v...), m.dsn)) }
