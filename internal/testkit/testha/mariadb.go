package testha

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// MariaDB is a mariadbd of one test's own (the machine's MariaDB build,
// a fresh datadir from mariadb-install-db), so that the test may change
// GLOBAL settings such as read_only, which the shared server's other users
// must never see.
type MariaDB struct {
	t    testing.TB
	Port int
	dir  string
	proc *process
	// Admin is a pool on the server as root (every privilege, READ_ONLY
	// ADMIN included: read_only does not hold it back).
	Admin *sql.DB
}

// StartMariaDB installs a datadir and starts mariadbd on a free port,
// stopped (and its files removed) when t ends. It reads no option file
// (--no-defaults): the machine's my.cnf belongs to the shared server.
func StartMariaDB(t testing.TB) *MariaDB {
	t.Helper()
	testkit.RequireBinary(t, "mariadbd", "mariadb-install-db")
	// not t.TempDir(): the socket path must stay short (108 bytes)
	dir, err := os.MkdirTemp("", "testha-mariadb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	var user []string
	if os.Geteuid() == 0 {
		// mariadbd refuses to run as root unless told to; the datadir
		// is root's, so that is who it runs as
		user = []string{"--user=root"}
	}
	install := append(append([]string{"--no-defaults"}, user...), "--datadir="+data,
		"--auth-root-authentication-method=normal", "--skip-test-db")
	if out, err := exec.Command("mariadb-install-db", install...).CombinedOutput(); err != nil {
		t.Fatalf("mariadb-install-db %v: %v\n%s", install, err, out)
	}
	m := &MariaDB{t: t, Port: testkit.FreePort(t), dir: dir}
	args := append(append([]string{"--no-defaults"}, user...), "--datadir="+data,
		"--port="+strconv.Itoa(m.Port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "pid"),
		"--log-error="+filepath.Join(dir, "error.log"), "--tmpdir="+dir,
		"--skip-log-bin", "--max-connections=500", "--innodb-buffer-pool-size=64M",
		// a test machine's disk: what is measured here is refusal, not
		// durability
		"--innodb-flush-log-at-trx-commit=2")
	m.proc = newProcess("mariadbd", "mariadbd", args...)
	if err := m.proc.start(); err != nil {
		t.Fatalf("starting mariadbd: %v", err)
	}
	t.Cleanup(func() {
		if m.Admin != nil {
			m.Admin.Close()
		}
		m.proc.stop(syscall.SIGTERM, 30*time.Second)
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			t.Logf("private mariadbd error log:\n%s", b)
		}
	})
	m.Admin, err = sql.Open("mysql", m.rootDSN(""))
	if err != nil {
		t.Fatal(err)
	}
	m.Admin.SetMaxOpenConns(4)
	testkit.Watch(time.Now().Add(60*time.Second), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err = m.Admin.PingContext(ctx)
		cancel()
		return err == nil || !m.proc.running() // a process that is gone will not answer
	})
	if err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "error.log"))
		t.Fatalf("private mariadbd did not answer on port %d: %v\n%s%s", m.Port, err, m.proc.logs.String(), b)
	}
	return m
}

func (m *MariaDB) rootDSN(db string) string {
	return fmt.Sprintf("root@tcp(127.0.0.1:%d)/%s", m.Port, db)
}

// NewDatabase creates a database and a user that holds every privilege on
// it and none on the server (no SUPER, no READ_ONLY ADMIN): the account an
// application gets from a managed service, refused by read_only as such an
// account is while a failover runs. It returns a DSN for that user and
// database (parseTime=true, then whatever adjust sets), and the root DSN
// of the same database, for the test's own queries.
func (m *MariaDB) NewDatabase(t testing.TB, adjust func(*mysql.Config)) (appDSN, rootDSN string) {
	t.Helper()
	b := make([]byte, 5)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	name, user, pass := "ha_"+suffix, "app_"+suffix, "pw-"+suffix
	for _, q := range []string{
		"CREATE DATABASE " + name,
		fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", user, pass),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON %s.* TO '%s'@'127.0.0.1'", name, user),
	} {
		if _, err := m.Admin.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	cfg := mysql.NewConfig()
	cfg.User, cfg.Passwd, cfg.Net, cfg.Addr, cfg.DBName = user, pass, "tcp", fmt.Sprintf("127.0.0.1:%d", m.Port), name
	cfg.ParseTime = true
	if adjust != nil {
		adjust(cfg)
	}
	return cfg.FormatDSN(), m.rootDSN(name) + "?parseTime=true"
}

// SetReadOnly sets GLOBAL read_only on this server, as a managed MySQL
// does to the old primary during a failover.
func (m *MariaDB) SetReadOnly(on bool) error {
	v := "OFF"
	if on {
		v = "ON"
	}
	_, err := m.Admin.Exec("SET GLOBAL read_only = " + v)
	return err
}
