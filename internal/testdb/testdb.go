// Package testdb gives each test its own MySQL/MariaDB database: created as
// test_<random>, dropped when the test ends, reached through a real pool.
//
// The server comes from STEPCOLLECT_TEST_MYSQL_DSN (default
// root@tcp(127.0.0.1:3306)/). When it does not answer the test is skipped,
// except under CI=true, where it fails: CI must never pass by skipping.
package testdb

import (
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
)

// DefaultServerDSN is the server tests use unless STEPCOLLECT_TEST_MYSQL_DSN says otherwise.
const DefaultServerDSN = "root@tcp(127.0.0.1:3306)/"

// PoolSize is the size of the pool tests get: large enough that concurrent
// callers really run concurrently (a pool of one hides every race), small
// enough that parallel test packages stay under the server's
// max_connections (151 by default).
const PoolSize = 48

// Options adjust a test database.
type Options struct {
	// LockWaitTimeout sets the session's innodb_lock_wait_timeout in seconds
	// (per session, never GLOBAL). Default 2.
	LockWaitTimeout int
	// NoInterpolate keeps server-side prepared statements.
	NoInterpolate bool
}

// DB is a fresh, empty test database.
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

// RequireServer fails (under CI=true) or skips the test when the server does
// not answer.
func RequireServer(t testing.TB) {
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

// New creates a database for t and drops it when t ends.
func New(t testing.TB, opts *Options) *DB {
	t.Helper()
	RequireServer(t)
	if opts == nil {
		opts = &Options{}
	}
	if opts.LockWaitTimeout == 0 {
		opts.LockWaitTimeout = 2
	}
	admin, err := sql.Open("mysql", ServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })

	b := make([]byte, 6)
	rand.Read(b)
	name := "test_" + hex.EncodeToString(b)
	ctx := context.Background()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("creating test database: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+name); err != nil {
			t.Errorf("dropping test database %s: %v", name, err)
		}
	})

	cfg, err := mysql.ParseDSN(ServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName = name
	cfg.ParseTime = true
	cfg.InterpolateParams = !opts.NoInterpolate
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_lock_wait_timeout"] = strconv.Itoa(opts.LockWaitTimeout)
	dsn := cfg.FormatDSN()
	if opts.NoInterpolate {
		dsn = strings.Replace(dsn, "?", "?interpolateParams=false&", 1)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(PoolSize)
	db.SetMaxIdleConns(PoolSize)
	t.Cleanup(func() { db.Close() })
	return &DB{DB: db, Name: name, DSN: dsn}
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
		t.Fatal(err)
	}
	return c
}

// Count runs a query whose one row is integers and returns them, failing t
// on any error: a broken count query must fail the test, never read as 0.
func Count(t testing.TB, db *sql.DB, query string, args ...any) int {
	t.Helper()
	var n int
	if err := db.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", strings.TrimSpace(query), err)
	}
	return n
}
