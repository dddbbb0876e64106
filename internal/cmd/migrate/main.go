// Command migrate creates the database named in the DSN if it does not exist
// and applies stepcollect's schema migrations to it. `make run` uses it to
// prepare a local database; the binaries migrate on their own (-migrate).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-sql-driver/mysql"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

const defaultDSN = "root@tcp(127.0.0.1:3306)/stepcollect?parseTime=true"

func main() {
	dsn := flag.String("mysql-dsn", envOr("STEPCOLLECT_MYSQL_DSN", defaultDSN), "MySQL DSN (env STEPCOLLECT_MYSQL_DSN)")
	flag.Parse()
	if err := run(*dsn); err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(1)
	}
}

func run(dsn string) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("-mysql-dsn: %w", err)
	}
	if cfg.DBName == "" {
		return fmt.Errorf("-mysql-dsn: names no database")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := stepmysql.EnsureDatabase(ctx, dsn); err != nil {
		return err
	}

	db, err := stepmysql.OpenDB(dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := stepmysql.Migrate(ctx, db); err != nil {
		return err
	}
	cur, _, err := stepmysql.SchemaVersion(ctx, db)
	if err != nil {
		return err
	}
	fmt.Printf("database %s on %s is at schema version %d\n", cfg.DBName, cfg.Addr, cur)
	return nil
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
