package testha

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/tcpproxy"
)

// Replicated is a primary and an asynchronous replica of it, the
// deployment docs/operations.md fails over behind a DNS name.
type Replicated struct {
	Primary, Replica *SQLServer
	// Link carries the replication stream from the primary to the
	// replica, with its delay; Cut fails the link and drops what was on
	// its way, as the loss of the primary's host or network does.
	Link *tcpproxy.Proxy
}

// StartMariaDBReplicated starts two private mariadbd: a primary writing a
// binary log (sync_binlog=1, durable commits), and a read-only replica
// following it by GTID through Link, delay away (each way), from before
// anything is written.
func StartMariaDBReplicated(t testing.TB, delay time.Duration) *Replicated {
	t.Helper()
	primary := startMariaDB(t, MariaDBConfig{LogBin: true, Durable: true, Args: []string{"--server-id=1"}})
	link := tcpproxy.Start(t, fmt.Sprintf("127.0.0.1:%d", primary.Port))
	link.SetDelay(delay)
	replica := startMariaDB(t, MariaDBConfig{Durable: true, Args: []string{"--server-id=2", "--read-only"}})
	_, port, err := net.SplitHostPort(link.Addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		fmt.Sprintf("CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=%s, MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, MASTER_CONNECT_RETRY=1", port),
		"START SLAVE",
	} {
		if _, err := replica.Admin.Exec(q); err != nil {
			t.Fatalf("replica: %s: %v", q, err)
		}
	}
	r := &Replicated{Primary: primary, Replica: replica, Link: link}
	testkit.WaitUntil(t, 30*time.Second, "the replica replicating", func() (bool, any) {
		st, err := r.Replica.slaveStatus()
		return err == nil && st["Slave_IO_Running"] == "Yes" && st["Slave_SQL_Running"] == "Yes", fmt.Sprintf("%v %v", st, err)
	})
	return r
}

// AwaitCaughtUp waits until the replica has applied everything the primary
// has written (its gtid_binlog_pos): a database the test made there.
func (r *Replicated) AwaitCaughtUp(within time.Duration) error {
	var pos string
	if err := r.Primary.Admin.QueryRow("SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		return fmt.Errorf("primary's position: %w", err)
	}
	var got int
	if err := r.Replica.Admin.QueryRow("SELECT MASTER_GTID_WAIT(?, ?)", pos, within.Seconds()).Scan(&got); err != nil || got != 0 {
		return fmt.Errorf("the replica did not reach the primary's %s within %v (%d, %v)", pos, within, got, err)
	}
	return nil
}

// Promote makes the replica the primary as a failover tool does once the
// old one is gone: it lets the replica apply what it had received (up to
// within), stops and forgets replication, and takes writes. It returns the
// GTID position the replica had received, the last the new primary holds.
func (r *Replicated) Promote(within time.Duration) (string, error) {
	st, err := r.Replica.slaveStatus()
	if err != nil {
		return "", err
	}
	received := st["Gtid_IO_Pos"]
	ctx, cancel := context.WithTimeout(context.Background(), within+5*time.Second)
	defer cancel()
	var got sql.NullInt64
	if err := r.Replica.Admin.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, ?)", received, within.Seconds()).Scan(&got); err != nil || got.Int64 != 0 {
		return received, fmt.Errorf("the replica did not apply what it had received (%s) within %v (%v, %v)", received, within, got, err)
	}
	for _, q := range []string{"STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL read_only = OFF"} {
		if _, err := r.Replica.Admin.ExecContext(ctx, q); err != nil {
			return received, fmt.Errorf("promoting the replica: %s: %w", q, err)
		}
	}
	return received, nil
}

// slaveStatus is SHOW SLAVE STATUS as column name to value (empty when
// the server replicates from nobody).
func (s *SQLServer) slaveStatus() (map[string]string, error) {
	rows, err := s.Admin.Query("SHOW SLAVE STATUS")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	if !rows.Next() {
		return out, rows.Err()
	}
	vals := make([]sql.NullString, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	if err := rows.Scan(ptrs...); err != nil {
		return nil, err
	}
	for i, c := range cols {
		out[c] = vals[i].String
	}
	return out, rows.Err()
}

// startMariaDB is StartMariaDB shaped by cfg.
func startMariaDB(t testing.TB, cfg MariaDBConfig) *SQLServer {
	t.Helper()
	testkit.RequireBinary(t, "mariadbd", "mariadb-install-db")
	// not t.TempDir(): the socket path must stay short (108 bytes)
	dir, err := os.MkdirTemp("", "testha-mariadb")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := newMariaDB(dir, testkit.FreePort(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.t = t
	s.launch()
	return s
}
