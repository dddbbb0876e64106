package nanomdm

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"

	nanomysql "github.com/micromdm/nanomdm/storage/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// NewMySQLDB is a fresh database for t on the test server
// (testkit.ServerDSN) holding NanoMDM's schema, for Options{Storage:
// "mysql", DSN: db.DSN}. NanoMDM's MySQL storage runs on MySQL only (its
// `INSERT … AS new` is not MariaDB's syntax): on MariaDB t is skipped,
// under CI too, as the server is there but of the other kind; `make
// test-mysql` runs it on MySQL. A server that does not answer fails t
// under CI=true (testkit.RequireMySQL).
func NewMySQLDB(t testing.TB) *testkit.DB {
	t.Helper()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(version, "MariaDB") {
		t.Skipf("NanoMDM's MySQL storage does not run on MariaDB (%s); run with STEPCOLLECT_TEST_MYSQL_DSN on MySQL (make test-mysql)", version)
	}
	if err := LoadSchema(context.Background(), db.DB); err != nil {
		t.Fatal(err)
	}
	return db
}

// LoadSchema loads NanoMDM's schema.sql (the one its storage embeds) into
// the database db is open on. Its foreign keys reference keys MySQL 8.4
// and later refuse by default (Error 6125), so on a server that has
// restrict_fk_on_non_standard_key it is turned off for the loading
// session only.
func LoadSchema(ctx context.Context, db *sql.DB) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("loading NanoMDM's schema: %w", err)
	}
	defer conn.Close()
	var name, value string
	err = conn.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'restrict_fk_on_non_standard_key'").Scan(&name, &value)
	switch {
	case errors.Is(err, sql.ErrNoRows): // MariaDB, MySQL before 8.4
	case err != nil:
		return fmt.Errorf("loading NanoMDM's schema: reading restrict_fk_on_non_standard_key: %w", err)
	default:
		if _, err := conn.ExecContext(ctx, "SET SESSION restrict_fk_on_non_standard_key = OFF"); err != nil {
			return fmt.Errorf("loading NanoMDM's schema: %w", err)
		}
	}
	for q := range strings.SplitSeq(nanomysql.Schema, ";") {
		if strings.TrimSpace(q) == "" {
			continue
		}
		if _, err := conn.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("loading NanoMDM's schema: %w\n%s", err, strings.TrimSpace(q))
		}
	}
	return nil
}
