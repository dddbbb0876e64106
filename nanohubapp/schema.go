package nanohubapp

import (
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
	mdmmysql "github.com/micromdm/nanomdm/storage/mysql"
)

//go:embed kmfddm_schema.sql
var kmfddmSchema string

// foreignSchemas are the schemas of the storages NanoHUB uses as they are,
// each loaded where its first table is missing (NanoHUB leaves them to the
// operator; their files are not idempotent).
var foreignSchemas = []struct{ name, firstTable, sql string }{
	{"NanoMDM v0.9.0", "devices", mdmmysql.Schema},
	{"KMFDDM v0.8.3", "declarations", kmfddmSchema},
}

// schemaLock serialises the loading across replicas started together.
const schemaLock = "stepcollect_nanohub_schema"

// requireMySQL refuses MariaDB: NanoMDM's and KMFDDM's MySQL storages write
// with MySQL's `INSERT … AS new` row alias, which MariaDB does not parse.
func requireMySQL(ctx context.Context, db *sql.DB) error {
	var version string
	if err := db.QueryRowContext(ctx, "SELECT VERSION()").Scan(&version); err != nil {
		return fmt.Errorf("-storage mysql: reading the server's version: %w", err)
	}
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return fmt.Errorf("-storage mysql: the server is MariaDB %s; NanoMDM's and KMFDDM's MySQL storages need MySQL 8.0.19 or later (their INSERT … AS new is not MariaDB's syntax)", version)
	}
	return nil
}

// loadSchemas creates NanoMDM's and KMFDDM's tables where they are missing.
// Their foreign keys reference keys MySQL 8.4 and later refuse by default
// (error 6125), so restrict_fk_on_non_standard_key is turned off for this
// session only, where the server has it.
func loadSchemas(ctx context.Context, db *sql.DB) (err error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("loading schemas: %w", err)
	}
	defer conn.Close()
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 60)", schemaLock).Scan(&got); err != nil || got.Int64 != 1 {
		return fmt.Errorf("loading schemas: taking lock %s: %v (got %v)", schemaLock, err, got)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(?)", schemaLock)
	var name, value string
	err = conn.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'restrict_fk_on_non_standard_key'").Scan(&name, &value)
	switch {
	case errors.Is(err, sql.ErrNoRows): // MySQL before 8.4
	case err != nil:
		return fmt.Errorf("loading schemas: reading restrict_fk_on_non_standard_key: %w", err)
	default:
		if _, err := conn.ExecContext(ctx, "SET SESSION restrict_fk_on_non_standard_key = OFF"); err != nil {
			return fmt.Errorf("loading schemas: %w", err)
		}
	}
	if err := ensureSHA1(ctx, conn); err != nil {
		return err
	}
	for _, s := range foreignSchemas {
		var n int
		if err := conn.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?", s.firstTable).Scan(&n); err != nil {
			return fmt.Errorf("loading %s's schema: %w", s.name, err)
		}
		if n > 0 {
			continue
		}
		for q := range strings.SplitSeq(s.sql, ";") {
			if strings.TrimSpace(q) == "" {
				continue
			}
			if _, err := conn.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("loading %s's schema: %w\n%s", s.name, err, strings.TrimSpace(q))
			}
		}
	}
	return nil
}

// sha1Shim stands in for SHA1() where the server has none (MySQL 9.7 as
// Debian builds it): KMFDDM's storage computes each declaration's server
// token with it and stores nothing without it. The token is opaque to the
// devices, which compare it only with itself, so SHA-256's first 40 hex
// digits serve as well. Where the server has SHA1() its own is called.
const sha1Shim = "CREATE FUNCTION SHA1(s LONGTEXT) RETURNS CHAR(40) CHARSET ascii DETERMINISTIC NO SQL RETURN LEFT(SHA2(s, 256), 40)"

// ensureSHA1 creates sha1Shim in the database where SHA1() does not exist.
func ensureSHA1(ctx context.Context, conn *sql.Conn) error {
	var sum string
	err := conn.QueryRowContext(ctx, "SELECT SHA1('')").Scan(&sum)
	var me *mysql.MySQLError
	if !errors.As(err, &me) || me.Number != 1305 { // ER_SP_DOES_NOT_EXIST
		return err
	}
	if _, err := conn.ExecContext(ctx, sha1Shim); err != nil {
		return fmt.Errorf("creating the function SHA1 (the server has none; KMFDDM's storage needs one): %w", err)
	}
	return nil
}
