package testkit

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/events"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// DefaultServerDSN is the server tests use unless STEPCOLLECT_TEST_MYSQL_DSN says otherwise.
const DefaultServerDSN = "root@tcp(127.0.0.1:3306)/"

// PoolSize is the size of the pool tests get: large enough that concurrent
// callers really run concurrently (a pool of one hides every race), small
// enough that parallel test packages stay under the server's
// max_connections (151 by default).
const PoolSize = 48

// DBOptions adjust a test database.
type DBOptions struct {
	// LockWaitTimeout sets the session's innodb_lock_wait_timeout in seconds
	// (per session, through the DSN, never GLOBAL). Default 2.
	LockWaitTimeout int
	// NoInterpolate keeps server-side prepared statements
	// (interpolateParams=false).
	NoInterpolate bool
	// Empty leaves the database unmigrated, for tests of the migrations
	// themselves or of a schema made by someone else.
	Empty bool
	// PlainPool opens the pool with sql.Open instead of OpenDB: no session
	// setup (the server's isolation level) and time parameters sent as the
	// driver sends them. For tests of what the storage does on a pool it
	// did not open (WithDB), as an embedding program's.
	PlainPool bool
	// Server is the DSN (root, no database) of the server to create the
	// database on: a private one a test started; ServerDSN() when empty.
	Server string
	// Charset is the database's default character set (CREATE DATABASE
	// … CHARACTER SET), as an older database's (utf8mb3, latin1); the
	// server's default when empty.
	Charset string
}

// DB is a fresh test database: created as test_<random>, dropped when the
// test ends, and reached through a real pool opened by the service's own
// stepmysql.OpenDB (every session at READ COMMITTED, parameters
// interpolated unless NoInterpolate).
type DB struct {
	*sql.DB
	Name string
	DSN  string // for this database, with the session settings
}

// ServerDSN returns the configured server DSN.
func ServerDSN() string {
	if dsn := os.Getenv("STEPCOLLECT_TEST_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	return DefaultServerDSN
}

// RequireMySQL fails (under CI=true) or skips the test when the server does
// not answer.
func RequireMySQL(t testing.TB) {
	t.Helper()
	db, err := sql.Open("mysql", ServerDSN())
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = db.PingContext(ctx)
		cancel()
		db.Close()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("MySQL/MariaDB at %s is required under CI and does not answer: %v", ServerDSN(), err)
		}
		t.Skipf("MySQL/MariaDB at %s does not answer (%v); set STEPCOLLECT_TEST_MYSQL_DSN", ServerDSN(), err)
	}
}

// NewDB creates a database for t, migrates it (unless opts.Empty) and
// drops it when t ends.
func NewDB(t testing.TB, opts *DBOptions) *DB {
	t.Helper()
	RequireMySQL(t)
	holdDBSlot(t) // before the pool, so that it is given back after it closes
	if opts == nil {
		opts = &DBOptions{}
	}
	lockWait := opts.LockWaitTimeout
	if lockWait == 0 {
		lockWait = 2
	}
	server := cmp.Or(opts.Server, ServerDSN())
	admin, err := sql.Open("mysql", server)
	if err != nil {
		t.Fatalf("opening the server %s: %v", server, err)
	}
	t.Cleanup(func() { admin.Close() })

	b := make([]byte, 6)
	rand.Read(b)
	name := "test_" + hex.EncodeToString(b)
	create := "CREATE DATABASE " + name
	if opts.Charset != "" {
		create += " CHARACTER SET " + opts.Charset
	}
	if _, err := admin.ExecContext(context.Background(), create); err != nil {
		t.Fatalf("creating test database: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
		}
	})

	cfg, err := mysql.ParseDSN(server)
	if err != nil {
		t.Fatalf("server DSN: %v", err)
	}
	cfg.DBName = name
	cfg.ParseTime = true
	cfg.InterpolateParams = !opts.NoInterpolate
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = strconv.Itoa(lockWait)
	dsn := cfg.FormatDSN()
	if opts.NoInterpolate {
		// FormatDSN leaves the default out; OpenDB turns interpolation on
		// unless the DSN names it
		dsn = strings.Replace(dsn, "?", "?interpolateParams=false&", 1)
	}
	open := stepmysql.OpenDB
	if opts.PlainPool {
		open = func(dsn string) (*sql.DB, error) { return sql.Open("mysql", dsn) }
	}
	db, err := open(dsn)
	if err != nil {
		t.Fatalf("opening test database %s: %v", name, err)
	}
	db.SetMaxOpenConns(PoolSize)
	db.SetMaxIdleConns(PoolSize)
	t.Cleanup(func() { db.Close() })
	if !opts.Empty {
		if err := stepmysql.Migrate(context.Background(), db); err != nil {
			t.Fatalf("migrating test database %s: %v", name, err)
		}
	}
	return &DB{DB: db, Name: name, DSN: dsn}
}

// OrNew is db, or a new database for t when db is nil: for setups that
// take a database or make one.
func (db *DB) OrNew(t testing.TB) *DB {
	t.Helper()
	if db != nil {
		return db
	}
	return NewDB(t, nil)
}

// StepRows is what the three step tables hold.
type StepRows struct{ Steps, IDCommands, StepCommands int }

// CountStepRows counts the rows of steps, id_commands and step_commands.
func CountStepRows(t testing.TB, db *sql.DB) StepRows {
	t.Helper()
	var c StepRows
	err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands)`).
		Scan(&c.Steps, &c.IDCommands, &c.StepCommands)
	if err != nil {
		t.Fatalf("counting step rows: %v", err)
	}
	return c
}

// Count runs a query whose one row is one integer and returns it, failing
// t on any error: a broken count query must fail the test, never read as 0.
func Count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", strings.TrimSpace(query), err)
	}
	return n
}

// Column runs a query of one column and returns its values in the order
// the rows came, failing t on any error (the query, a scan, the rows').
func Column[T any](t testing.TB, db *sql.DB, query string, args ...any) []T {
	t.Helper()
	rows, err := db.Query(query, args...)
	if err != nil {
		t.Fatalf("%s: %v", strings.TrimSpace(query), err)
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			t.Fatalf("%s: %v", strings.TrimSpace(query), err)
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("%s: %v", strings.TrimSpace(query), err)
	}
	return out
}

// OutboxRows counts the events in the outbox, delivered or not yet
// acknowledged.
func OutboxRows(t testing.TB, db *sql.DB) int {
	t.Helper()
	return Count(t, db, `SELECT COUNT(*) FROM stepcollect_outbox`)
}

// EventID is the id of the event of type typ about stepID and enrollment
// that the storage on db writes: in that database's salt.
func EventID(t testing.TB, db *sql.DB, typ string, stepID int64, enrollment string) string {
	t.Helper()
	salt, err := stepmysql.EventIDSalt(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	return events.ID(salt, typ, stepID, enrollment)
}
