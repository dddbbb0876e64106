// Command migrate creates the database named in the DSN if it does not exist
// and applies stepcollect's schema migrations to it. `make run` uses it to
// prepare a local database; the binaries migrate on their own (-migrate).
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/config"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

func main() {
	// the binaries' flag conventions: env fallback, one-line errors, the
	// DSN's password kept out of -h
	s := config.New("migrate", os.Getenv)
	dsn := s.DSN("mysql-dsn", "STEPCOLLECT_MYSQL_DSN", config.DefaultMySQLDSN, "MySQL/MariaDB DSN (go-sql-driver form) of the database to create and migrate")
	s.Check(config.MySQLDSN("mysql-dsn", dsn))
	if err := s.Parse(os.Args[1:]); config.IsHelp(err) {
		s.Usage(os.Stdout)
		return
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "migrate:", err)
		os.Exit(2)
	}
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
