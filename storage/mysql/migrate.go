package mysql

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/pressly/goose/v3"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationsTable is where goose records which migrations ran. It is
// stepcollect's own, so a NanoCMD database gains one table and nothing else
// changes.
const MigrationsTable = "stepcollect_schema_migrations"

// migrateLockName prefixes the GET_LOCK name (the database name follows)
// that serialises Migrate across processes: replicas starting together all
// call Migrate, one applies, the others wait and then find nothing to do.
const migrateLockName = "stepcollect.migrate."

// Migrate applies the embedded schema migrations to db. Migration 1 is
// NanoCMD v0.7.1's schema with IF NOT EXISTS, so a database NanoCMD made is
// adopted as it is; later migrations add, but for migration 9, which drops
// three of id_commands' indexes that nothing reads, and migration 14, which
// makes a command, its result and a step's context MEDIUMBLOB so that bytes
// that are not UTF-8 are stored as sent. Idempotent, and safe to call
// from many processes at once.
//
// The lock is held on a connection of its own for the whole of it, not
// through goose's session locker: goose checks for pending migrations, and
// creates its version table, before taking that lock, and on MySQL a
// CREATE TABLE commits at once, so a second process could see the table
// before its first row and fail. So Migrate needs two connections of db's
// pool.
func Migrate(ctx context.Context, db *sql.DB) error {
	return UnderMigrationLock(ctx, db, migrateLockName, func() error {
		p, err := newMigrationProvider(db)
		if err != nil {
			return err
		}
		if _, err := p.Up(ctx); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		return restoreRoutines(ctx, db, p)
	})
}

// UnderMigrationLock runs fn holding the GET_LOCK name (scoped to db's
// database) on a connection of its own, so that replicas starting together
// migrate one at a time; a process that dies holding it releases it with
// its connection. fn's statements need a second connection of the pool.
func UnderMigrationLock(ctx context.Context, db *sql.DB, name string, fn func() error) error {
	if db.Stats().MaxOpenConnections == 1 {
		return errors.New("migrate: needs a pool of at least two connections (one holds the migration lock)")
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	defer conn.Close()
	l := getLock{name: name}
	if err := l.SessionLock(ctx, conn); err != nil {
		return err
	}
	defer l.SessionUnlock(context.WithoutCancel(ctx), conn)
	return fn()
}

// routineMigrations are the migrations that create the routines results
// are committed with (procedure.go), with their versions and how many
// routines each creates.
var routineMigrations = []struct {
	path     string
	version  int64
	routines int
}{
	{"migrations/00012_complete_predicted_procedure.sql", 12, 2},
	{"migrations/00013_complete_single_procedure.sql", 13, 1},
}

// restoreRoutines creates a routine of migration 12 or 13 again where the
// migration ran but the routine is gone: a dump taken without routines
// (mysqldump without --routines) and restored, or a DROP by hand. goose
// records a migration once, so without this nothing would bring them
// back, and results would go on without them.
func restoreRoutines(ctx context.Context, db *sql.DB, p *goose.Provider) error {
	v, err := p.GetDBVersion(ctx)
	if err != nil {
		return fmt.Errorf("migrate: schema version: %w", err)
	}
	for _, m := range routineMigrations {
		if v < m.version {
			continue // not migrated this far: nothing to restore
		}
		creates, err := routineCreates(m.path, m.routines)
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		for name, create := range creates {
			var n int
			if err := db.QueryRowContext(ctx, qRoutineExists, name).Scan(&n); err != nil {
				return fmt.Errorf("migrate: looking for routine %s: %w", name, err)
			}
			if n > 0 {
				continue
			}
			if _, err := db.ExecContext(ctx, create); err != nil {
				return fmt.Errorf("migrate: creating routine %s again: %w", name, err)
			}
		}
	}
	return nil
}

// routineCreates is the CREATE PROCEDURE statements of the migration at
// path, each between goose's StatementBegin and StatementEnd, by routine
// name; want is how many it has.
func routineCreates(path string, want int) (map[string]string, error) {
	b, err := migrationFiles.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	rest := string(b)
	for {
		_, after, ok := strings.Cut(rest, "-- +goose StatementBegin\n")
		if !ok {
			break
		}
		create, tail, ok := strings.Cut(after, "-- +goose StatementEnd")
		if !ok {
			return nil, fmt.Errorf("%s: a StatementBegin without its StatementEnd", path)
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(create, "CREATE PROCEDURE "), "(")
		out[name] = create
		rest = tail
	}
	if len(out) != want {
		return nil, fmt.Errorf("%s: %d routines, want %d", path, len(out), want)
	}
	return out, nil
}

// SchemaVersion returns the database's applied migration version and the
// newest one this build embeds.
func SchemaVersion(ctx context.Context, db *sql.DB) (current, latest int64, err error) {
	p, err := newMigrationProvider(db)
	if err != nil {
		return 0, 0, err
	}
	current, latest, err = p.GetVersions(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("schema version: %w", err)
	}
	return current, latest, nil
}

func newMigrationProvider(db *sql.DB) (*goose.Provider, error) {
	fsys, err := fs.Sub(migrationFiles, "migrations")
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectMySQL, db, fsys,
		goose.WithTableName(MigrationsTable),
		goose.WithDisableGlobalRegistry(true),
	)
	if err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return p, nil
}

// getLock is a lock on MySQL's GET_LOCK, scoped to the database. It lives
// with its connection, so a process that dies mid-migration releases it.
type getLock struct{ name string }

func (l getLock) SessionLock(ctx context.Context, conn *sql.Conn) error {
	for {
		var got sql.NullInt64
		// a bounded wait per call, so ctx is honoured between calls
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(LEFT(CONCAT(?, DATABASE()), 64), 5)", l.name).Scan(&got); err != nil {
			return fmt.Errorf("migration lock %q: %w", l.name, err)
		}
		if got.Valid && got.Int64 == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("migration lock %q: %w", l.name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (l getLock) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	var released sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT RELEASE_LOCK(LEFT(CONCAT(?, DATABASE()), 64))", l.name).Scan(&released); err != nil {
		return fmt.Errorf("migration unlock %q: %w", l.name, err)
	}
	if !released.Valid || released.Int64 != 1 {
		return errors.New("migration unlock: lock " + l.name + " was not held")
	}
	return nil
}

// EnsureDatabase creates the database dsn names if it does not exist, so a
// fresh server needs nothing done by hand before the first start.
func EnsureDatabase(ctx context.Context, dsn string) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("mysql dsn: %w", err)
	}
	if cfg.DBName == "" {
		return errors.New("mysql dsn: names no database")
	}
	name := cfg.DBName
	cfg.DBName = ""
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer admin.Close()
	// utf8mb4 whatever the server's default (latin1 on many builds)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE IF NOT EXISTS `"+strings.ReplaceAll(name, "`", "``")+"` CHARACTER SET utf8mb4"); err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	return nil
}
