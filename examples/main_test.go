// Package examples_test holds docs/engines.md's longer examples as compiled and
// run Go: NanoCMD using stepcollect's storage. TestMain gives them a fresh
// database on the test server (STEPCOLLECT_TEST_MYSQL_DSN, default
// root@tcp(127.0.0.1:3306)/) through NANOCMD_MYSQL_DSN, the variable the
// example reads its DSN from, and drops it afterwards. Without a server
// they are not run, only the check that docs/engines.md shows them as they are
// (under CI=true that is a failure).
package examples_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	server := testkit.ServerDSN()
	admin, err := sql.Open("mysql", server)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err = admin.PingContext(ctx)
		cancel()
	}
	if err != nil {
		if os.Getenv("CI") == "true" {
			fmt.Fprintf(os.Stderr, "examples: MySQL/MariaDB at %s is required under CI and does not answer: %v\n", server, err)
			return 1
		}
		fmt.Printf("examples: MySQL/MariaDB at %s does not answer (%v): only the docs check runs\n", server, err)
		flag.Set("test.run", "^TestTheREADMEShowsTheCompiledExamples$")
		return m.Run()
	}
	defer admin.Close()
	b := make([]byte, 6)
	rand.Read(b)
	name := "test_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		fmt.Fprintln(os.Stderr, "examples: creating the database:", err)
		return 1
	}
	defer admin.Exec("DROP DATABASE IF EXISTS " + name)
	cfg, err := mysql.ParseDSN(server)
	if err != nil {
		fmt.Fprintln(os.Stderr, "examples:", err)
		return 1
	}
	cfg.DBName = name
	os.Setenv("NANOCMD_MYSQL_DSN", cfg.FormatDSN())
	return m.Run()
}
