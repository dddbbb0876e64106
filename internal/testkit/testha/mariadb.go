package testha

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// MariaDBConfig shapes a private mariadbd; the zero value is a test's.
type MariaDBConfig struct {
	// MaxConnections is max_connections (500 when 0).
	MaxConnections int
	// BufferPool is innodb_buffer_pool_size (64M when empty).
	BufferPool string
	// Durable keeps InnoDB's flush of the log at every commit: what the
	// bench measures. Without it the log is flushed once a second
	// (innodb_flush_log_at_trx_commit=2), which is enough on a test
	// machine's disk: a SIGKILL of the process loses nothing at 2 (the log
	// is in the page cache), only a crash of the host.
	Durable bool
	// LogBin writes a binary log, synced at every commit (sync_binlog=1),
	// as a server that replicas follow must; a test's runs without one.
	LogBin bool
	// Args are more mariadbd options, after the others.
	Args []string
	// InitSQL runs once, when the datadir is installed (mariadb-install-db
	// --extra-file): accounts the server must have before it starts.
	InitSQL string
}

// StartMariaDB installs a datadir (mariadb-install-db) and starts the
// machine's mariadbd on a free port, killed (and its files removed) when t
// ends. It reads no option file (--no-defaults): the machine's my.cnf
// belongs to the shared server.
func StartMariaDB(t testing.TB) *SQLServer {
	t.Helper()
	return startMariaDB(t, MariaDBConfig{})
}

// RunMariaDB is StartMariaDB outside a test (the bench's), shaped by cfg:
// the caller stops it, and removes its files, with Stop.
func RunMariaDB(cfg MariaDBConfig) (*SQLServer, error) {
	dir, err := os.MkdirTemp("", "testha-mariadb")
	if err != nil {
		return nil, err
	}
	port, err := testkit.PickPort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("finding a port for mariadbd: %w", err)
	}
	s, err := newMariaDB(dir, port, cfg)
	if err == nil {
		s.dir = dir
		err = s.open()
	}
	if err != nil {
		if s != nil {
			s.Stop()
		}
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// newMariaDB installs a datadir under dir and makes the server's process
// (not started) on port, shaped by cfg.
func newMariaDB(dir string, port int, cfg MariaDBConfig) (*SQLServer, error) {
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = 500
	}
	if cfg.BufferPool == "" {
		cfg.BufferPool = "64M"
	}
	data := filepath.Join(dir, "data")
	var user []string
	if os.Geteuid() == 0 {
		// mariadbd refuses to run as root unless told to; the datadir
		// is root's, so that is who it runs as
		user = []string{"--user=root"}
	}
	// its own tmpdir: installs running at once in the shared /tmp removed
	// one another's temporary tables ("Error on delete of
	// '/tmp/#sql-temptable-…'"), as three Galera nodes' installs did
	install := append(append([]string{"--no-defaults"}, user...), "--datadir="+data, "--tmpdir="+dir,
		"--auth-root-authentication-method=normal", "--skip-test-db")
	if cfg.InitSQL != "" {
		f := filepath.Join(dir, "init.sql")
		if err := os.WriteFile(f, []byte(cfg.InitSQL), 0o600); err != nil {
			return nil, err
		}
		install = append(install, "--extra-file="+f)
	}
	if out, err := exec.Command("mariadb-install-db", install...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("mariadb-install-db %v: %v\n%s", install, err, out)
	}
	s := &SQLServer{Kind: MariaDB, Port: port, errorLog: filepath.Join(dir, "error.log")}
	s.adminNet, s.adminAddr = "tcp", fmt.Sprintf("127.0.0.1:%d", s.Port)
	args := append(append([]string{"--no-defaults"}, user...), "--datadir="+data,
		"--port="+strconv.Itoa(s.Port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "pid"),
		"--log-error="+s.errorLog, "--tmpdir="+dir,
		"--max-connections="+strconv.Itoa(cfg.MaxConnections),
		"--innodb-buffer-pool-size="+cfg.BufferPool)
	if cfg.LogBin {
		args = append(args, "--log-bin="+filepath.Join(dir, "binlog"), "--sync-binlog=1")
	} else {
		args = append(args, "--skip-log-bin")
	}
	if !cfg.Durable {
		args = append(args, "--innodb-flush-log-at-trx-commit=2")
	}
	s.proc = newProcess("mariadbd", "mariadbd", append(args, cfg.Args...)...)
	return s, nil
}
