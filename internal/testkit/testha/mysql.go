package testha

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// defaultMySQLChroot is where scripts/mysql.sh installs MySQL 9.7
// (STEPCOLLECT_MYSQL_CHROOT there and here).
const defaultMySQLChroot = "/var/lib/stepcollect-mysql-chroot"

// StartMySQL starts Oracle MySQL's mysqld from scripts/mysql.sh's chroot
// (the distribution ships no MySQL; unstable's needs a newer libc) on a
// free port, with a fresh datadir of its own under the chroot's /tmp,
// killed (and its files removed) when t ends. The shared server the script
// runs from the same chroot shares nothing with it but the binaries.
//
// It runs as the shared one does, with MySQL's defaults where the script
// keeps them (binary log on, sync_binlog=1, caching_sha2_password), so what
// it refuses, and how it comes back after Kill, is what production's does.
// A missing chroot skips t, except under CI=true, where it fails.
func StartMySQL(t testing.TB) *SQLServer {
	t.Helper()
	s := newMySQL(t, mysqlChroot(t), testkit.FreePort(t), nil)
	s.launch()
	return s
}

// mysqlChroot is scripts/mysql.sh's chroot, or t skipped (failed under
// CI=true) when it is missing or cannot be entered.
func mysqlChroot(t testing.TB) string {
	t.Helper()
	root := os.Getenv("STEPCOLLECT_MYSQL_CHROOT")
	if root == "" {
		root = defaultMySQLChroot
	}
	var missing string
	if _, err := os.Stat(filepath.Join(root, "usr/sbin/mysqld")); err != nil {
		missing = "MySQL's chroot (scripts/mysql.sh makes it, as root): " + err.Error()
	} else if _, err := exec.LookPath("chroot"); err != nil {
		missing = "chroot: " + err.Error()
	} else if os.Geteuid() != 0 {
		missing = "root, to run mysqld through chroot"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("a private MySQL is required under CI (CI=true) and needs %s", missing)
		}
		t.Skipf("a private MySQL needs %s", missing)
	}
	return root
}

// newMySQL initializes a datadir under the chroot's /tmp (removed when t
// ends) and returns the server on port, its flags followed by extra, not
// yet started (launch starts it).
func newMySQL(t testing.TB, root string, port int, extra []string) *SQLServer {
	t.Helper()
	s, err := newMySQLAt(root, port, extra)
	if s != nil {
		dir := s.dir
		t.Cleanup(func() { os.RemoveAll(dir) })
		s.t, s.dir = t, ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newMySQLAt is newMySQL outside a test: the datadir is s.dir, which Stop
// removes (so does the caller after an error, where s is not nil).
func newMySQLAt(root string, port int, extra []string) (*SQLServer, error) {
	// Everything under the chroot's /tmp: mysqld sees dir without the
	// root prefix, this process with it. Short, for the socket's 108 bytes.
	dir, err := os.MkdirTemp(filepath.Join(root, "tmp"), "testha-mysql")
	if err != nil {
		return nil, err
	}
	s := &SQLServer{Kind: MySQL, Port: port, errorLog: filepath.Join(dir, "error.log"), dir: dir}
	in := strings.TrimPrefix(dir, filepath.Clean(root))
	data := in + "/data"
	// --initialize-insecure (root@localhost, no password) writes the data
	// dictionary with some 800 fsyncs, about 10 s on this disk; without
	// them about 4 s. Only the server started below has to be durable.
	initialize := []string{root, "mysqld", "--no-defaults", "--initialize-insecure", "--user=root",
		"--datadir=" + data, "--log-error=" + in + "/init.log",
		"--innodb-flush-method=nosync", "--innodb-doublewrite=OFF", "--innodb-flush-log-at-trx-commit=0",
		"--skip-log-bin", "--innodb-redo-log-capacity=16M"}
	if out, err := exec.Command("chroot", initialize...).CombinedOutput(); err != nil {
		b, _ := os.ReadFile(filepath.Join(dir, "init.log"))
		return s, fmt.Errorf("chroot %v: %v\n%s%s", initialize, err, out, b)
	}

	// root@localhost matches only the socket under --skip-name-resolve
	s.adminNet, s.adminAddr = "unix", filepath.Join(dir, "sock")
	args := []string{root, "mysqld", "--no-defaults", "--user=root", "--datadir=" + data,
		"--port=" + strconv.Itoa(s.Port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--socket=" + in + "/sock", "--pid-file=" + in + "/pid", "--log-error=" + in + "/error.log",
		"--tmpdir=" + in, "--secure-file-priv=",
		// scripts/mysql.sh's flags
		"--mysqlx=OFF", "--max-allowed-packet=16M", "--max-connections=500",
		"--innodb-buffer-pool-size=64M", "--innodb-redo-log-capacity=16M"}
	// chroot execs mysqld: the process's pid is the server's, for Kill
	s.proc = newProcess("mysqld", "chroot", append(args, extra...)...)
	return s, nil
}
