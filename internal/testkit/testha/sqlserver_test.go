package testha

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
)

// errNo is the server error number in err's chain, 0 for none.
func errNo(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// The private server of the suite's kind refuses the application user's
// writes while SetReadOnly holds, with error 1290, and takes them again
// after; that user holds nothing that read_only lets through. Root is
// refused too on MySQL (super_read_only), and not on MariaDB (READ_ONLY
// ADMIN): the two servers differ there, and the failover tests rely on
// the application user being refused on both. Killed and restarted, the
// server keeps what was committed and takes writes again.
func TestSQLServerReadOnlyAndRestart(t *testing.T) {
	t.Parallel()
	s := StartSQLServer(t)
	appDSN, rootDSN := s.NewDatabase(t, nil)
	app, err := sql.Open("mysql", appDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	root, err := sql.Open("mysql", rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	mustExec := func(db *sql.DB, q string) {
		t.Helper()
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	mustExec(app, "CREATE TABLE t (id INT PRIMARY KEY)")
	mustExec(app, "INSERT INTO t VALUES (1)")

	rows, err := app.Query("SHOW GRANTS FOR CURRENT_USER()")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var g string
		if err := rows.Scan(&g); err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{"SUPER", "CONNECTION_ADMIN", "READ_ONLY ADMIN", "ON *.*"} {
			if strings.Contains(g, p) && !strings.HasPrefix(g, "GRANT USAGE ON *.*") {
				t.Errorf("the application user holds %q: %s", p, g)
			}
		}
	}
	rows.Close()

	if err := s.SetReadOnly(true); err != nil {
		t.Fatal(err)
	}
	_, err = app.Exec("INSERT INTO t VALUES (2)")
	if errNo(err) != 1290 {
		t.Errorf("%s read-only: the application user's INSERT answered %v, want error 1290", s.Kind, err)
	}
	t.Logf("%s read-only, the application user: %v", s.Kind, err)
	_, err = root.Exec("INSERT INTO t VALUES (3)")
	switch s.Kind {
	case MySQL:
		if errNo(err) != 1290 || !strings.Contains(err.Error(), "super-read-only") {
			t.Errorf("MySQL super_read_only: root's INSERT answered %v, want error 1290 naming --super-read-only", err)
		}
	case MariaDB:
		if err != nil {
			t.Errorf("MariaDB read_only: root's INSERT answered %v; root holds READ_ONLY ADMIN", err)
		}
		mustExec(root, "DELETE FROM t WHERE id = 3")
	}
	t.Logf("%s read-only, root: %v", s.Kind, err)

	if err := s.SetReadOnly(false); err != nil {
		t.Fatal(err)
	}
	var ro, sro int
	if err := s.Admin.QueryRow("SELECT @@GLOBAL.read_only").Scan(&ro); err != nil {
		t.Fatal(err)
	}
	if s.Kind == MySQL {
		if err := s.Admin.QueryRow("SELECT @@GLOBAL.super_read_only").Scan(&sro); err != nil {
			t.Fatal(err)
		}
	}
	if ro != 0 || sro != 0 {
		t.Errorf("after SetReadOnly(false): read_only=%d super_read_only=%d", ro, sro)
	}
	mustExec(app, "INSERT INTO t VALUES (4)")

	s.Kill()
	if s.Running() {
		t.Fatal("still running after Kill")
	}
	if err := app.Ping(); err == nil {
		t.Error("the killed server answered a ping")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	mustExec(app, "INSERT INTO t VALUES (5)")
	var ids []string
	rows, err = app.Query("SELECT id FROM t ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	rows.Close()
	if got := strings.Join(ids, ","); got != "1,4,5" {
		t.Errorf("after the kill and restart the table holds %s, want 1,4,5", got)
	}
}
