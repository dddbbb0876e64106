package testha

import (
	"context"
	"database/sql"
	"testing"
	"time"
)

// A three-node Galera cluster: a row committed on one node is on the
// others; two nodes' SKIP LOCKED claims of the same row both succeed, as
// row locks are local to a node until certification, and one of them
// fails at COMMIT with a deadlock (1213), the other commits; with one node
// killed the other two keep the quorum and take writes.
func TestGaleraReplicatesCertifiesAndSurvivesANode(t *testing.T) {
	t.Parallel()
	g := StartGalera(t, 3)
	ctx := t.Context()
	a, c := g.Nodes[0].Admin, g.Nodes[2].Admin
	// reads that wait for the node to have applied the cluster's commits
	// (without it a node may not show another's commit yet)
	read := func(db *sql.DB, q string, dest ...any) error {
		conn, err := db.Conn(ctx)
		if err != nil {
			return err
		}
		defer conn.Close()
		if _, err := conn.ExecContext(ctx, "SET SESSION wsrep_sync_wait = 1"); err != nil {
			return err
		}
		return conn.QueryRowContext(ctx, q).Scan(dest...)
	}
	for _, q := range []string{
		"CREATE DATABASE ha_galera",
		"CREATE TABLE ha_galera.t (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO ha_galera.t VALUES (1, 0)",
	} {
		if _, err := a.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	var v int
	if err := read(c, "SELECT v FROM ha_galera.t WHERE id = 1", &v); err != nil {
		t.Fatalf("the row committed on node 0, read on node 2: %v", err)
	}

	// the same claim on two nodes at once
	claim := func(db *sql.DB) (*sql.Tx, error) {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return nil, err
		}
		var id int
		if err := tx.QueryRowContext(ctx, "SELECT id FROM ha_galera.t WHERE id = 1 FOR UPDATE SKIP LOCKED").Scan(&id); err != nil {
			tx.Rollback()
			return nil, err
		}
		_, err = tx.ExecContext(ctx, "UPDATE ha_galera.t SET v = v + 1 WHERE id = 1")
		return tx, err
	}
	ta, err := claim(a)
	if err != nil {
		t.Fatalf("claim on node 0: %v", err)
	}
	tc, err := claim(c)
	if err != nil {
		t.Fatalf("claim on node 2 (its lock is local: it should see the row): %v", err)
	}
	errA := ta.Commit()
	errC := tc.Commit()
	if (errA == nil) == (errC == nil) || errNo(first(errA, errC)) != 1213 {
		t.Fatalf("commits: node 0 %v, node 2 %v; want exactly one, the other a deadlock (1213)", errA, errC)
	}

	// one node gone: two of three keep the quorum
	g.Nodes[1].Kill()
	waitFor(t, 30*time.Second, func() bool { return g.Nodes[0].Status("wsrep_cluster_size") == "2" })
	if _, err := c.ExecContext(ctx, "UPDATE ha_galera.t SET v = v + 1 WHERE id = 1"); err != nil {
		t.Fatalf("a write with one node of three gone: %v", err)
	}
	if err := read(a, "SELECT v FROM ha_galera.t WHERE id = 1", &v); err != nil || v != 2 {
		t.Fatalf("v on node 0: %d, %v; want 2 (one claim, one write)", v, err)
	}
}

// first is the first non-nil error of errs.
func first(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// waitFor polls cond every 100 ms until it holds, failing t after within.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("not within %v", within)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
