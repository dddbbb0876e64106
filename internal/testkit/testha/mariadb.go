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

// StartMariaDB installs a datadir (mariadb-install-db) and starts the
// machine's mariadbd on a free port, killed (and its files removed) when t
// ends. It reads no option file (--no-defaults): the machine's my.cnf
// belongs to the shared server.
func StartMariaDB(t testing.TB) *SQLServer {
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
	s := &SQLServer{Kind: MariaDB, t: t, Port: testkit.FreePort(t), errorLog: filepath.Join(dir, "error.log")}
	s.adminNet, s.adminAddr = "tcp", fmt.Sprintf("127.0.0.1:%d", s.Port)
	args := append(append([]string{"--no-defaults"}, user...), "--datadir="+data,
		"--port="+strconv.Itoa(s.Port), "--bind-address=127.0.0.1", "--skip-name-resolve",
		"--socket="+filepath.Join(dir, "sock"), "--pid-file="+filepath.Join(dir, "pid"),
		"--log-error="+s.errorLog, "--tmpdir="+dir,
		"--skip-log-bin", "--max-connections=500", "--innodb-buffer-pool-size=64M",
		// a test machine's disk: a SIGKILL of the process loses nothing
		// at 2 (the log is in the page cache), only a crash of the host
		"--innodb-flush-log-at-trx-commit=2")
	s.proc = newProcess("mariadbd", "mariadbd", args...)
	s.launch()
	return s
}
