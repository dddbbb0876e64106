package testha

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// A three-member Group Replication group behind its Balancer, with the
// setting docs/operations.md gives for a fast failover
// (group_replication_member_expel_timeout=0; the e2e/failover test keeps
// the default, 5): a write through the Balancer lands on the primary; with
// the primary SIGKILLed, the group elects member 1 (the weights), the
// Balancer moves to it and writes through it work again; a secondary refuses writes
// with 1290 (super_read_only); the killed member rejoins as a secondary
// and has every row.
func TestGroupReplicationElectsAPrimaryTheBalancerFollows(t *testing.T) {
	t.Parallel()
	g := StartGroupReplication(t, GroupConfig{Args: []string{"--group-replication-member-expel-timeout=0"}})
	if p := g.Primary(0); p != 0 {
		t.Fatalf("the bootstrapped group's primary is member %d, want 0", p)
	}
	appDSN, _ := g.Members[0].NewDatabase(t, nil)
	cfg, err := mysql.ParseDSN(appDSN)
	if err != nil {
		t.Fatal(err)
	}
	direct := cfg.Clone()
	direct.Addr = g.Members[2].addr()
	cfg.Addr = g.Balancer.Addr
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	secondary, err := sql.Open("mysql", direct.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer secondary.Close()
	for _, q := range []string{
		"CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO t VALUES (1, 0)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s through the Balancer: %v", q, err)
		}
	}
	_, err = secondary.Exec("INSERT INTO t VALUES (2, 0)")
	if errNo(err) != 1290 {
		t.Errorf("a write on secondary member 2: %v, want error 1290 (super_read_only)", err)
	}

	g.Members[0].Kill()
	killed := time.Now()
	var elected time.Duration
	waitFor(t, 60*time.Second, func() bool {
		if g.Primary(1) == 1 {
			elected = time.Since(killed)
			return true
		}
		return false
	})
	db.SetMaxIdleConns(0) // every statement through a new connection: the Balancer's choice now
	var wrote time.Duration
	waitFor(t, 30*time.Second, func() bool {
		_, err = db.Exec("UPDATE t SET v = v + 1 WHERE id = 1")
		if err == nil {
			wrote = time.Since(killed)
		}
		return err == nil
	})
	if err := g.Rejoin(0, 90*time.Second); err != nil {
		t.Fatal(err)
	}
	if p := g.Primary(0); p != 1 {
		t.Errorf("after member 0 rejoined, it sees member %d as primary, want 1", p)
	}
	if _, err := db.Exec("UPDATE t SET v = v + 1 WHERE id = 1"); err != nil {
		t.Errorf("a write through the Balancer after member 0 rejoined (as a secondary, which the Balancer must not pick again): %v", err)
	}
	var v int
	waitFor(t, 30*time.Second, func() bool {
		return g.Members[0].Admin.QueryRow("SELECT v FROM "+cfg.DBName+".t WHERE id = 1").Scan(&v) == nil && v == 2
	})
	t.Logf("primary killed (member_expel_timeout 0): member 1 elected after %v, the first write through the Balancer after %v", elected.Round(time.Millisecond), wrote.Round(time.Millisecond))
}

// The primary of a group on a private network is cut off (every packet to
// and from its host dropped): the two members left elect member 1, and a
// write through the Balancer reaches it once its health check has moved;
// healed, member 0 rejoins the group by itself, as a secondary, and has
// the row.
func TestGroupReplicationPrimaryPartitionedAway(t *testing.T) {
	t.Parallel()
	g := StartGroupReplication(t, GroupConfig{Partitionable: true, Args: []string{"--group-replication-member-expel-timeout=0"}})
	appDSN, _ := g.Members[0].NewDatabase(t, nil)
	cfg, err := mysql.ParseDSN(appDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = g.Balancer.Addr
	cfg.Timeout = 10 * time.Second
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxIdleConns(0) // every statement through a new connection: the Balancer's choice
	for _, q := range []string{
		"CREATE TABLE t (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO t VALUES (1, 0)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s through the Balancer: %v", q, err)
		}
	}
	if err := g.Members[0].Host().Cut(); err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	var elected time.Duration
	waitFor(t, 60*time.Second, func() bool {
		if g.Primary(1) == 1 {
			elected = time.Since(cut)
			return true
		}
		return false
	})
	// member 0 still holds itself primary, of a group it cannot reach
	t.Logf("member 0, cut off, sees %v", g.Membership(0))
	var wrote time.Duration
	waitFor(t, 30*time.Second, func() bool {
		// each try bounded, as the storage bounds its own: a connection
		// still on the cut-off member goes silent
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err = db.ExecContext(ctx, "UPDATE t SET v = v + 1 WHERE id = 1")
		if err == nil {
			wrote = time.Since(cut)
		}
		return err == nil
	})
	if err := g.Members[0].Host().Heal(); err != nil {
		t.Fatal(err)
	}
	healed := time.Now()
	if err := g.AwaitOnline(3, 1, 120*time.Second); err != nil {
		t.Fatal(err)
	}
	rejoined := time.Since(healed)
	if p := g.Primary(0); p != 1 {
		t.Errorf("after member 0 rejoined, it sees member %d as primary, want 1", p)
	}
	var v int
	waitFor(t, 30*time.Second, func() bool {
		return g.Members[0].Admin.QueryRow("SELECT v FROM "+cfg.DBName+".t WHERE id = 1").Scan(&v) == nil && v == 1
	})
	t.Logf("primary cut off (member_expel_timeout 0): member 1 elected after %v, the first write through the Balancer after %v; healed, member 0 back ONLINE after %v",
		elected.Round(time.Millisecond), wrote.Round(time.Millisecond), rejoined.Round(time.Millisecond))
}
