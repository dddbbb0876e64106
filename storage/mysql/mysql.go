// Package mysql is stepcollect's MySQL/MariaDB storage: a NanoCMD
// storage.AllStorage whose result path locks only the reporting
// enrollment's rows, and collects a step after the commit, outside any
// transaction, or hands it to a ReleaseSink. Why that is safe, and the
// invariants every change keeps: docs/design.md.
package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/storage"
)

// Storage implements NanoCMD's storage.AllStorage on MySQL 8.0.19+ and
// MariaDB 10.6+.
type Storage struct {
	db    *sql.DB
	ownDB bool
	// twoTrips: the pool takes several statements in one query, and
	// completions run in two round trips (see conntx.go).
	twoTrips bool
	// hints: what this process saw of steps and enrollments, from which a
	// completion predicts its rows and commits in one round trip
	// (onetrip.go)
	hints *hints
	// proc: which routines (migrations 12 and 13) predicted results CALL
	// (procedure.go)
	proc     *completeProc
	logger   zerolog.Logger
	sink     storage.ReleaseSink
	observer storage.Observer
	txOpts   *sql.TxOptions
	outbox   bool
	receipts bool // WithReceipts
	steps    *stepCache
	inline   *releaseGroups
	lookups  *lookups
	charset  idCharset // of the engine's id columns (holdable.go)
	// maxPacket is the server's max_allowed_packet (or WithMaxPacket's),
	// which every statement and so every event must fit.
	maxPacket int

	maxAttempts    int
	attemptTimeout time.Duration
	backoffBase    time.Duration
	backoffMax     time.Duration

	// claims is where this process's event claims start (claimstart.go).
	claims claimStart

	// salt is the database's event id salt once read (eventSalt).
	salt   atomic.Pointer[events.Salt]
	saltMu sync.Mutex

	// results holds a token for each result in a transaction now
	// (WithMaxActiveResults); nil: no bound but the pool's.
	results     chan struct{}
	resultsPeak atomic.Int64 // the most at once so far, for tests
}

var _ storage.AllStorage = (*Storage)(nil)

type config struct {
	db          *sql.DB
	dsn         string
	logger      zerolog.Logger
	sink        storage.ReleaseSink
	observer    storage.Observer
	isolation   sql.IsolationLevel
	maxAttempts int
	attemptTO   time.Duration
	outbox      bool
	receipts    bool
	maxPacket   int
	maxResults  int
}

// Option configures a Storage.
type Option func(*config)

// WithDB uses db. The caller keeps ownership: Close does not close it.
func WithDB(db *sql.DB) Option { return func(c *config) { c.db = db } }

// WithDSN opens a pool from a go-sql-driver DSN. Unless the DSN says
// otherwise, parameters are interpolated client-side (interpolateParams=true):
// it halves the round trips of every statement, and the driver refuses it for
// the few character sets where it would be unsafe.
func WithDSN(dsn string) Option { return func(c *config) { c.dsn = dsn } }

// WithLogger sets the logger. The storage logs only what it deliberately
// does not return (collection failures) and its retries, at debug level.
func WithLogger(l zerolog.Logger) Option { return func(c *config) { c.logger = l } }

// WithReleaseSink hands the steps each commit released to sink, after the
// commit, instead of collecting them inline.
func WithReleaseSink(sink storage.ReleaseSink) Option { return func(c *config) { c.sink = sink } }

// WithObserver reports retries, commit latency and collections to o.
func WithObserver(o storage.Observer) Option { return func(c *config) { c.observer = o } }

// WithIsolation sets the isolation level of every transaction the storage
// runs (sql.LevelReadCommitted, say). The default is the server's. Set per
// transaction, so it works whatever the DSN and on both MySQL and MariaDB,
// whose session variable names differ.
func WithIsolation(l sql.IsolationLevel) Option { return func(c *config) { c.isolation = l } }

// WithOutbox makes each enrollment's completion also write its
// step.completed event to the outbox, in the same transaction as the deletes
// it reports, so that a completion is never known only to the process that
// committed it. The service uses it; NanoCMD, which takes the returned step
// directly, does not need it.
func WithOutbox() Option { return func(c *config) { c.outbox = true } }

// WithReceipts makes each enrollment's completion, without the outbox,
// write a receipt in its transaction, so that a COMMIT whose answer was
// lost is settled by it (the completed step returned, not an error) as the
// outbox's event settles it. Receipts are for that moment only: call
// PruneReceipts now and then. cmd/nanocmd uses it: its engine learns of a
// completion only from the webhook's answer.
func WithReceipts() Option { return func(c *config) { c.receipts = true } }

// DefaultMaxActiveResults is WithMaxActiveResults' default.
const DefaultMaxActiveResults = 64

// WithMaxActiveResults bounds the results (StoreCommandResponseAndRetrieveCompletedStep)
// this storage has in a transaction at once: more wait their turn on their
// context, and a try that backs off gives its turn up while it waits. Far
// more transactions at once than the server has cores only slow each one
// down (measured in docs/benchmarks.md). The pool (WithDB, OpenDB) may be
// larger, for the other statements and the worker's. 0:
// DefaultMaxActiveResults; negative: no bound but the pool's.
func WithMaxActiveResults(n int) Option { return func(c *config) { c.maxResults = n } }

// DefaultAttemptTimeout is how long one try of a transaction may take
// before it is given up (WithAttemptTimeout).
const DefaultAttemptTimeout = 10 * time.Second

// WithAttemptTimeout bounds each try of a transaction: past d its
// connection is closed (the server rolls back what it held) and the
// transaction is tried again on a fresh one, a COMMIT cut off so settled
// by evidence. A server gone silent (cut off, or a Group Replication
// primary without its majority) would otherwise hold a transaction, and
// the pool, until TCP gives up (docs/operations.md, "Database clusters").
// 0 takes no bound. Default DefaultAttemptTimeout.
func WithAttemptTimeout(d time.Duration) Option { return func(c *config) { c.attemptTO = d } }

// WithMaxPacket takes n bytes as the server's max_allowed_packet instead of
// reading it at New: for tests that need a small one without changing the
// server's GLOBAL settings. Sizes are checked against it before anything
// is committed (docs/reference.md, Limits).
func WithMaxPacket(n int) Option { return func(c *config) { c.maxPacket = n } }

// New returns a Storage. One of WithDB or WithDSN is required. It does not
// migrate; call Migrate first (the binaries do, with -migrate).
func New(opts ...Option) (*Storage, error) {
	cfg := &config{logger: zerolog.Nop(), observer: storage.NopObserver{}, maxAttempts: 10, attemptTO: DefaultAttemptTimeout}
	for _, opt := range opts {
		opt(cfg)
	}
	s := &Storage{
		db:             cfg.db,
		logger:         cfg.logger,
		sink:           cfg.sink,
		observer:       cfg.observer,
		outbox:         cfg.outbox,
		receipts:       cfg.receipts && !cfg.outbox,
		steps:          newStepCache(4096, 10*time.Minute),
		hints:          newHints(),
		proc:           &completeProc{logger: cfg.logger},
		maxAttempts:    max(cfg.maxAttempts, 1),
		attemptTimeout: max(cfg.attemptTO, 0),
		backoffBase:    5 * time.Millisecond,
		backoffMax:     500 * time.Millisecond,
	}
	if n := cmp.Or(cfg.maxResults, DefaultMaxActiveResults); n > 0 {
		s.results = make(chan struct{}, n)
	}
	s.lookups = s.newLookups()
	s.inline = newReleaseGroups(s.collectInline)
	if cfg.isolation != sql.LevelDefault {
		s.txOpts = &sql.TxOptions{Isolation: cfg.isolation}
	}
	if s.db == nil {
		if cfg.dsn == "" {
			return nil, errors.New("mysql storage: no database: use WithDB or WithDSN")
		}
		db, err := OpenDB(cfg.dsn)
		if err != nil {
			return nil, err
		}
		s.db, s.ownDB = db, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.db.PingContext(ctx); err != nil {
		if s.ownDB {
			s.db.Close()
		}
		return nil, fmt.Errorf("mysql storage: ping: %w", err)
	}
	s.maxPacket = cfg.maxPacket
	if s.maxPacket <= 0 {
		n, err := readMaxPacket(ctx, s.db)
		if err != nil {
			if s.ownDB {
				s.db.Close()
			}
			return nil, err
		}
		// The driver refuses to send more than its own limit, whatever the
		// server takes.
		s.maxPacket = min(n, clientMaxPacket(cfg.dsn))
	}
	// Completions start their transactions by hand on that path, at the
	// session's level: a level set per transaction (WithIsolation) keeps
	// database/sql's transaction.
	s.twoTrips = s.txOpts == nil && supportsMultiStatements(ctx, s.db)
	if s.maxPacket <= 2*stmtOverhead {
		if s.ownDB {
			s.db.Close()
		}
		return nil, fmt.Errorf("mysql storage: max_allowed_packet %d bytes: too small to store anything", s.maxPacket)
	}
	return s, nil
}

// OpenDB opens a pool for dsn as WithDSN does: parseTime on,
// interpolateParams and multiStatements on and time parameters truncated
// to microseconds (timeTruncate=1µs) unless the DSN sets them, and every
// session at READ
// COMMITTED, the level stepcollect's transactions are designed for. Set
// once per connection by a statement both MySQL and MariaDB take (their
// DSN variable names differ), it costs nothing per transaction, where
// sql.TxOptions costs go-sql-driver a round trip each time.
//
// Its pool is DefaultPool; an embedder applies its own with Pool.Apply.
func OpenDB(dsn string) (*sql.DB, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	mc.ParseTime = true
	if !strings.Contains(dsn, "interpolateParams=") {
		mc.InterpolateParams = true
	}
	if !strings.Contains(dsn, "multiStatements=") {
		// Completions in two round trips (conntx.go). Every parameter is
		// interpolated and escaped by the driver, never concatenated into
		// the SQL, so no value can end a statement and start another.
		mc.MultiStatements = true
	}
	if !strings.Contains(dsn, "timeTruncate=") {
		// See dbTime: every time parameter at most microseconds.
		if err := mc.Apply(mysql.TimeTruncate(time.Microsecond)); err != nil {
			return nil, fmt.Errorf("mysql dsn: %w", err)
		}
	}
	conn, err := mysql.NewConnector(mc)
	if err != nil {
		return nil, fmt.Errorf("mysql dsn: %w", err)
	}
	db := sql.OpenDB(sessionConnector{Connector: conn, setup: []string{readCommittedSession}})
	DefaultPool.Apply(db)
	return db, nil
}

// DefaultPoolSize, DefaultConnMaxLifetime and DefaultConnMaxIdleTime are
// DefaultPool's.
const (
	DefaultPoolSize        = 64
	DefaultConnMaxLifetime = time.Hour
	DefaultConnMaxIdleTime = time.Minute
)

// Pool is the connection pool policy every binary applies (its flags
// -mysql-max-conns, -mysql-conn-max-lifetime, -mysql-conn-max-idle-time).
type Pool struct {
	// MaxConns bounds the connections open, idle ones included: every
	// replica's count adds up against the server's max_connections.
	MaxConns int
	// MaxLifetime closes a connection this long after it was opened, so a
	// failover or a proxy's rebalancing (Aurora, a service mesh) reaches
	// every connection; 0: never.
	MaxLifetime time.Duration
	// MaxIdleTime gives an idle connection back to the server after a
	// burst; 0: never.
	MaxIdleTime time.Duration
}

// DefaultPool is the pool OpenDB opens and the binaries' defaults.
var DefaultPool = Pool{MaxConns: DefaultPoolSize, MaxLifetime: DefaultConnMaxLifetime, MaxIdleTime: DefaultConnMaxIdleTime}

// Apply sets p on db. It keeps as many idle connections as it may open:
// database/sql's default keeps 2, and a server taking results at once
// would open and close a connection per result.
func (p Pool) Apply(db *sql.DB) {
	n := p.MaxConns
	if n <= 0 {
		n = DefaultPoolSize
	}
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	db.SetConnMaxLifetime(p.MaxLifetime)
	db.SetConnMaxIdleTime(p.MaxIdleTime)
}

const readCommittedSession = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED"

// sessionConnector runs setup statements on each new connection and hands
// back the driver's own connection, every interface of it intact.
type sessionConnector struct {
	driver.Connector
	setup []string
}

func (c sessionConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	for _, q := range c.setup {
		if _, err := conn.(driver.ExecerContext).ExecContext(ctx, q, nil); err != nil {
			conn.Close()
			return nil, fmt.Errorf("setting up the session (%s): %w", q, err)
		}
	}
	if err := causalReads(ctx, conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("setting up the session (Galera's wsrep_sync_wait): %w", err)
	}
	return conn, nil
}

// causalReads makes a Galera node's session wait, before each read, until
// the node has applied every write the cluster committed before the read
// began (wsrep_sync_wait's READ bit, kept beside any other set), so that
// no result reads another node's commit as not yet there
// (docs/operations.md, "MariaDB Galera"). MySQL has no wsrep_on and
// MariaDB without Galera has it off: nothing is set there. One statement
// per new connection.
func causalReads(ctx context.Context, conn driver.Conn) error {
	rows, err := conn.(driver.QueryerContext).QueryContext(ctx, "SELECT @@wsrep_on", nil)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errUnknownSystemVariable {
		return nil
	} else if err != nil {
		return err
	}
	v := make([]driver.Value, 1)
	err = rows.Next(v)
	rows.Close()
	if err != nil {
		return err
	}
	if on, _ := v[0].(int64); on != 1 {
		return nil
	}
	_, err = conn.(driver.ExecerContext).ExecContext(ctx, "SET SESSION wsrep_sync_wait = @@wsrep_sync_wait | 1", nil)
	return err
}

// errUnknownSystemVariable is MySQL's answer to SELECT @@wsrep_on.
const errUnknownSystemVariable = 1193

// clientMaxPacket is the most go-sql-driver sends on a pool from dsn: its
// maxAllowedPacket, or the driver's default (also for a pool from WithDB,
// whose DSN the storage does not see).
func clientMaxPacket(dsn string) int {
	if mc, err := mysql.ParseDSN(dsn); err == nil && dsn != "" && mc.MaxAllowedPacket > 0 {
		return mc.MaxAllowedPacket
	}
	return driverMaxPacket
}

// MaxPacket is the max_allowed_packet the storage sizes statements and
// events against.
func (s *Storage) MaxPacket() int { return s.maxPacket }

// DB returns the pool the storage uses.
func (s *Storage) DB() *sql.DB { return s.db }

// Close closes the pool if the storage opened it (WithDSN).
func (s *Storage) Close() error {
	if s.ownDB {
		return s.db.Close()
	}
	return nil
}

// dbTime is t as the server should see it in a comparison: microseconds,
// the most a TIMESTAMP holds. MariaDB 10.11 takes a literal with nine
// digits of nanoseconds as no temporal constant, so a claim's range on
// not_until or timeout becomes a scan that locks every step (CHANGELOG,
// before v0.1.0). OpenDB's pools truncate already; this covers WithDB's.
func dbTime(t time.Time) time.Time { return t.Truncate(time.Microsecond) }
