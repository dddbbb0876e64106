// Package mysqlstore holds NanoCMD's subsystem storages (profiles,
// inventory, command plans, the FileVault keypair) in MySQL or MariaDB,
// safe with any number of replicas on one database: profiles on NanoCMD's
// own subsystem_profiles table, inventory merged under a row lock, the
// FileVault keypair inserted only if absent.
package mysqlstore

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationsTable records which of this package's migrations ran; the
// engine's migrations have a table of their own.
const MigrationsTable = "nanocmd_subsystem_migrations"

// Migrate creates the subsystem tables that are missing, under a GET_LOCK,
// so replicas starting together apply them once. Idempotent; a NanoCMD
// v0.7.1 database keeps its subsystem_profiles, converted to utf8mb4 if
// they are not (migration 2, charset.go).
func Migrate(ctx context.Context, db *sql.DB) error {
	return stepmysql.UnderMigrationLock(ctx, db, "nanocmd.subsystems.", func() error {
		fsys, err := fs.Sub(migrationFiles, "migrations")
		if err != nil {
			return fmt.Errorf("subsystem migrate: %w", err)
		}
		p, err := goose.NewProvider(goose.DialectMySQL, db, fsys,
			goose.WithTableName(MigrationsTable), goose.WithDisableGlobalRegistry(true),
			goose.WithGoMigrations(goose.NewGoMigration(2, &goose.GoFunc{RunDB: convertToUTF8MB4}, nil)))
		if err != nil {
			return fmt.Errorf("subsystem migrate: %w", err)
		}
		if _, err := p.Up(ctx); err != nil {
			return fmt.Errorf("subsystem migrate: %w", err)
		}
		return nil
	})
}

// maxInList bounds the ids of one IN list.
const maxInList = 1000

// expand writes n placeholders for the query's one "IN (?)".
func expand(q string, n int) string {
	return strings.Replace(q, "IN (?)", "IN ("+strings.TrimSuffix(strings.Repeat("?,", n), ",")+")", 1)
}

func anys(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// chunks calls fn with successive slices of at most maxInList names.
func chunks(names []string, fn func([]string) error) error {
	for len(names) > 0 {
		n := min(len(names), maxInList)
		if err := fn(names[:n]); err != nil {
			return err
		}
		names = names[n:]
	}
	return nil
}

// MySQL/MariaDB errors a transaction is retried on: a deadlock, a lock
// wait timeout, and a duplicate key from a concurrent first insert (the
// retry then finds the row and locks it).
const (
	errDupEntry        = 1062
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
)

func retryable(err error) bool {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		switch me.Number {
		case errDupEntry, errLockWaitTimeout, errDeadlock:
			return true
		}
	}
	return false
}

const maxAttempts = 10

// inTx runs fn in a short transaction, retried from the start (fn keeps
// no state between tries) on the errors above, with jittered backoff.
func inTx(ctx context.Context, db *sql.DB, op string, fn func(tx *sql.Tx) error) error {
	return retry(ctx, op, func() error { return tryTx(ctx, db, fn) })
}

// retry runs fn, a whole transaction or one statement, again on the
// errors above.
func retry(ctx context.Context, op string, fn func() error) error {
	backoff := 5 * time.Millisecond
	for n := 1; ; n++ {
		err := fn()
		if err == nil {
			return nil
		}
		if !retryable(err) || n == maxAttempts || ctx.Err() != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", op, ctx.Err())
		case <-time.After(backoff/2 + rand.N(backoff)):
		}
		backoff = min(2*backoff, 500*time.Millisecond)
	}
}

func tryTx(ctx context.Context, db *sql.DB, fn func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}
