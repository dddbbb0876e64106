package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"

	"github.com/go-sql-driver/mysql"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// freshDatabase creates a database on server, migrates it with
// stepcollect's migrations (NanoCMD v0.7.1's schema, identical to
// v0.7.0's), and returns its DSN with params, and a drop function.
func freshDatabase(admin *sql.DB, server string, params map[string]string) (string, func(), error) {
	return newDatabase(admin, server, "bench_", params, false, func(db *sql.DB) error {
		return stepmysql.Migrate(context.Background(), db)
	})
}

// freshNanoCMDDatabase creates a database on server with NanoCMD's own
// schema, and returns its DSN with params, and a drop function.
func freshNanoCMDDatabase(admin *sql.DB, server, schema string, params map[string]string) (string, func(), error) {
	return newDatabase(admin, server, "bench_nanocmd_", params, true, func(db *sql.DB) error {
		if _, err := db.Exec(schema); err != nil {
			return fmt.Errorf("NanoCMD's schema: %w", err)
		}
		return nil
	})
}

// newDatabase creates a database named prefix + random on server, opens it
// (with multiStatements when multi) for setup to make its tables, and
// returns its DSN with params, and a drop function. On any error the
// database is dropped.
func newDatabase(admin *sql.DB, server, prefix string, params map[string]string, multi bool, setup func(*sql.DB) error) (string, func(), error) {
	b := make([]byte, 5)
	rand.Read(b)
	name := prefix + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		return "", nil, err
	}
	drop := func() { admin.Exec("DROP DATABASE IF EXISTS " + name) }
	cfg, err := mysql.ParseDSN(server)
	if err != nil {
		drop()
		return "", nil, err
	}
	cfg.DBName = name
	cfg.ParseTime = true
	setupCfg := cfg.Clone()
	setupCfg.MultiStatements = multi
	db, err := sql.Open("mysql", setupCfg.FormatDSN())
	if err != nil {
		drop()
		return "", nil, err
	}
	err = setup(db)
	db.Close()
	if err != nil {
		drop()
		return "", nil, err
	}
	dsn := cfg.FormatDSN()
	for k, v := range params {
		dsn += "&" + k + "=" + v
	}
	return dsn, drop, nil
}
