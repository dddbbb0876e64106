package testha

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// Kind is which server a SQLServer runs: the failover tests hold the
// service to the same promises on both, and the servers differ in what
// they refuse and how (see SetReadOnly).
type Kind string

const (
	MariaDB Kind = "mariadb" // the machine's mariadbd (StartMariaDB)
	MySQL   Kind = "mysql"   // Oracle MySQL's mysqld in scripts/mysql.sh's chroot (StartMySQL)
)

// SuiteKind is the kind of the server the suite runs on: MariaDB by
// default (`make test`), and whatever STEPCOLLECT_TEST_MYSQL_DSN answers
// when it is set (`make test-mysql` points it at MySQL 9.7), asked of the
// server itself: the variable names a MySQL-protocol server, either kind.
func SuiteKind(t testing.TB) Kind {
	t.Helper()
	if os.Getenv("STEPCOLLECT_TEST_MYSQL_DSN") == "" {
		return MariaDB
	}
	testkit.RequireMySQL(t)
	db, err := sql.Open("mysql", testkit.ServerDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatalf("asking %s its version: %v", testkit.ServerDSN(), err)
	}
	if strings.Contains(version, "MariaDB") {
		return MariaDB
	}
	return MySQL
}

// StartSQLServer starts a private server of the suite's kind (SuiteKind):
// the failover tests run on MariaDB in `make test` and on MySQL in `make
// test-mysql`, so CI runs both and neither target needs the other's server.
func StartSQLServer(t testing.TB) *SQLServer {
	t.Helper()
	if SuiteKind(t) == MySQL {
		return StartMySQL(t)
	}
	return StartMariaDB(t)
}

// SQLServer is a MySQL-protocol server of one test's own, with a fresh
// datadir, so that the test may change GLOBAL settings such as read_only,
// which the shared server's other users must never see, and kill it.
type SQLServer struct {
	Kind Kind
	Port int
	// Admin is a pool on the server as root (every privilege: read_only
	// alone does not hold it back on either kind).
	Admin *sql.DB

	t        testing.TB // nil outside a test (RunMariaDB)
	dir      string     // removed by Stop (RunMariaDB's)
	proc     *process
	errorLog string // the server's error log, as this process sees it
	// admin is where root connects: net and address (TCP on MariaDB, the
	// socket on MySQL, whose root@localhost does not match 127.0.0.1)
	adminNet, adminAddr string
	// On a Network (OnHost): the host it runs in, whose address it
	// listens on, and the address its clients come from.
	host       *Host
	clientHost string
}

// addr is the server's TCP address.
func (s *SQLServer) addr() string {
	ip := "127.0.0.1"
	if s.host != nil {
		ip = s.host.IP
	}
	return fmt.Sprintf("%s:%d", ip, s.Port)
}

// Addr is the server's TCP address: 127.0.0.1, or its host's address on
// a Network.
func (s *SQLServer) Addr() string { return s.addr() }

// Host is the network namespace the server runs in (nil on loopback).
func (s *SQLServer) Host() *Host { return s.host }

// onHost moves a server not yet started into host: it listens on the
// host's address only, and takes its clients from the network's gateway.
func (s *SQLServer) onHost(h *Host, nw *Network) {
	for i, a := range s.proc.args {
		if a == "--bind-address=127.0.0.1" {
			s.proc.args[i] = "--bind-address=" + h.IP
		}
	}
	s.proc.bin, s.proc.args = h.Run(s.proc.bin, s.proc.args...)
	s.host, s.clientHost = h, nw.prefix+"%"
}

// launch starts s.proc, waits until root's pool answers, and arranges for
// the server to be killed when t ends (before its datadir is removed by the
// caller's earlier cleanup: the datadir is thrown away, so a clean shutdown
// would only cost time).
func (s *SQLServer) launch() {
	t := s.t
	t.Helper()
	t.Cleanup(func() {
		if s.Admin != nil {
			s.Admin.Close()
		}
		s.proc.stop(syscall.SIGKILL, 10*time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(s.errorLog)
			t.Logf("private %s error log:\n%s%s", s.Kind, s.proc.logs.String(), b)
		}
	})
	if err := s.open(); err != nil {
		t.Fatal(err)
	}
}

// open makes root's pool and starts the server (start).
func (s *SQLServer) open() error {
	var err error
	if s.Admin, err = sql.Open("mysql", s.DSN()); err != nil {
		return err
	}
	s.Admin.SetMaxOpenConns(4)
	return s.start()
}

// DSN is root's on the server, no database.
func (s *SQLServer) DSN() string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", s.adminNet, s.adminAddr
	return cfg.FormatDSN()
}

// PID is the server's process id (0 before it started).
func (s *SQLServer) PID() int { return s.proc.pid() }

// Stop kills a server RunMariaDB started and removes its files (a test's
// goes when the test ends).
func (s *SQLServer) Stop() {
	if s.Admin != nil {
		s.Admin.Close()
	}
	s.proc.stop(syscall.SIGKILL, 10*time.Second)
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// start runs the server's process and waits (up to a minute: MySQL's crash
// recovery after Kill included) until root's pool answers.
func (s *SQLServer) start() error {
	if err := s.proc.start(); err != nil {
		return fmt.Errorf("starting %s: %w", s.Kind, err)
	}
	var err error
	testkit.Watch(time.Now().Add(60*time.Second), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = s.Admin.PingContext(ctx)
		cancel()
		return err == nil || !s.proc.running() // a process that is gone will not answer
	})
	if err != nil {
		b, _ := os.ReadFile(s.errorLog)
		return fmt.Errorf("private %s did not answer on port %d: %v\n%s%s", s.Kind, s.Port, err, s.proc.logs.String(), b)
	}
	return nil
}

// Kill stops the server with SIGKILL, as a crash or an OOM kill does: no
// goodbye to its clients, InnoDB's crash recovery on the next start.
func (s *SQLServer) Kill() { s.proc.stop(syscall.SIGKILL, 10*time.Second) }

// Freeze stops the server's process (SIGSTOP), as a paused VM or a
// stalled host does: its connections stay open and nothing answers on
// them, new connections are accepted by the kernel and never greeted.
// Thaw resumes it.
func (s *SQLServer) Freeze() { s.proc.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen server (SIGCONT).
func (s *SQLServer) Thaw() { s.proc.signal(syscall.SIGCONT) }

// Restart starts a killed server again, on the same port, datadir and
// flags, and returns once root's pool answers.
func (s *SQLServer) Restart() error {
	if s.proc.running() {
		return fmt.Errorf("restarting %s: it still runs; Kill it first", s.Kind)
	}
	return s.start()
}

// Running reports whether the server's process runs.
func (s *SQLServer) Running() bool { return s.proc.running() }

// NewDatabase creates a database and a user that holds every privilege on
// it and none on the server (no SUPER, CONNECTION_ADMIN or READ_ONLY
// ADMIN): the account an application gets from a managed service, refused
// by read_only as such an account is while a failover runs. It returns a
// DSN for that user and database (TCP, parseTime=true, then whatever
// adjust sets), and root's DSN of the same database, for the test's own
// queries.
func (s *SQLServer) NewDatabase(t testing.TB, adjust func(*mysql.Config)) (appDSN, rootDSN string) {
	t.Helper()
	b := make([]byte, 5)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	name, user, pass := "ha_"+suffix, "app_"+suffix, "pw-"+suffix
	from := "127.0.0.1"
	if s.clientHost != "" {
		from = s.clientHost
	}
	for _, q := range []string{
		"CREATE DATABASE " + name,
		fmt.Sprintf("CREATE USER '%s'@'%s' IDENTIFIED BY '%s'", user, from, pass),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON %s.* TO '%s'@'%s'", name, user, from),
	} {
		if _, err := s.Admin.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = user, pass, "tcp", s.addr(), name
	cfg.ParseTime = true
	if adjust != nil {
		adjust(cfg)
	}
	root := mysql.NewConfig()
	root.User, root.Net, root.Addr, root.DBName, root.ParseTime = "root", s.adminNet, s.adminAddr, name, true
	return cfg.FormatDSN(), root.FormatDSN()
}

// SetReadOnly makes the server refuse writes, as a managed service does to
// the old primary during a failover, or accept them again. On MariaDB that
// is read_only, which holds back every user without READ_ONLY ADMIN. On
// MySQL it is super_read_only (which sets read_only too), as MySQL's own
// failover tooling sets it: read_only alone lets SUPER and CONNECTION_ADMIN
// write, root included. Either way the server answers a refused write
// with error 1290 (ER_OPTION_PREVENTS_STATEMENT), naming the option.
func (s *SQLServer) SetReadOnly(on bool) error {
	var q string
	switch {
	case s.Kind == MySQL && on:
		q = "SET GLOBAL super_read_only = ON"
	case on:
		q = "SET GLOBAL read_only = ON"
	default:
		// on MySQL, read_only OFF turns super_read_only off too
		q = "SET GLOBAL read_only = OFF"
	}
	if _, err := s.Admin.Exec(q); err != nil {
		return fmt.Errorf("%s on the private %s: %w", q, s.Kind, err)
	}
	return nil
}
