package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/go-sql-driver/mysql"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// privateServer is a mariadbd of the benchmark's own, on a free port and a
// temporary datadir: the stricter setting needs 1000 connections, and the
// shared server's GLOBAL settings are not the benchmark's to change. Its
// binary log is on with sync_binlog=1; the settings but binlog keep their
// sessions out of it (sql_log_bin=0).
type privateServer struct {
	dir  string
	cmd  *exec.Cmd
	DSN  string // root, no database
	Port int
}

func startPrivateServer(maxConns int) (*privateServer, error) {
	dir, err := os.MkdirTemp("", "stepcollect-bench-db")
	if err != nil {
		return nil, err
	}
	exec.Command("chown", "mysql:mysql", dir).Run()
	if out, err := exec.Command("mariadb-install-db", "--user=mysql", "--datadir="+dir,
		"--auth-root-authentication-method=normal", "--skip-test-db").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("mariadb-install-db: %v\n%s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command("mariadbd", "--user=mysql", "--datadir="+dir, "--port="+strconv.Itoa(port),
		"--bind-address=127.0.0.1", "--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "pid"),
		"--log-bin="+filepath.Join(dir, "binlog"), "--sync-binlog=1", "--max-connections="+strconv.Itoa(maxConns), "--innodb-buffer-pool-size=512M",
		"--back-log=4096", "--log-error="+filepath.Join(dir, "error.log"))
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s := &privateServer{dir: dir, cmd: cmd, Port: port, DSN: fmt.Sprintf("root@tcp(127.0.0.1:%d)/", port)}
	db, _ := sql.Open("mysql", s.DSN)
	defer db.Close()
	for i := 0; ; i++ {
		if err := db.Ping(); err == nil {
			return s, nil
		} else if i > 200 {
			s.Stop()
			return nil, fmt.Errorf("private mariadbd did not answer: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *privateServer) Stop() {
	if s.cmd.Process != nil {
		s.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { s.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			s.cmd.Process.Kill()
		}
	}
	os.RemoveAll(s.dir)
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// freshDatabase creates a database on server, migrates it with
// stepcollect's migrations (NanoCMD v0.7.1's schema, identical to
// v0.7.0's), and returns its DSN with params, and a drop function.
func freshDatabase(admin *sql.DB, server string, params map[string]string) (string, func(), error) {
	return newDatabase(admin, server, "bench_", params, false, func(db *sql.DB) error {
		return stepmysql.Migrate(context.Background(), db)
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
