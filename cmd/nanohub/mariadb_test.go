package main_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// On MariaDB, -storage mysql stops at start with one line saying why:
// NanoMDM's and KMFDDM's MySQL storages write MySQL's INSERT … AS new.
func TestStorageMySQLOnMariaDBStopsNamingWhy(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") {
		t.Skipf("the server is MySQL %s", version)
	}
	out, err := exec.Command(bins["nanohub"], "-listen", testkit.FreeAddr(t), "-storage", "mysql", "-storage-dsn", db.DSN, "-ca", "/dev/null").CombinedOutput()
	if err == nil {
		t.Fatalf("started on MariaDB:\n%s", out)
	}
	if !strings.Contains(string(out), "need MySQL 8.0.19 or later") {
		t.Errorf("output does not say MySQL is needed:\n%s", out)
	}
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()"); n != 0 {
		t.Errorf("%d tables made on MariaDB before refusing", n)
	}
}
