package mysql_test

import (
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// A fan-out answered through two nodes of a Galera cluster at once, as two
// api replicas on two nodes would: row locks are local to a node until
// certification, so the collection's SKIP LOCKED claims can both succeed
// and one then fails at COMMIT (1213), as can a result whose rows the
// other node touched; and a node may not yet have applied what the other
// committed (OpenDB's sessions wait for it: causalReads). Every result
// must still be committed exactly once, each enrollment's completion
// returned once, no caller given an error, and the step collected, as on
// one server.
func TestAFanOutThroughTwoGaleraNodesCommitsEveryResultOnce(t *testing.T) {
	t.Parallel()
	g := testha.StartGalera(t, 3)
	ctx := t.Context()
	if _, err := g.Nodes[0].Admin.ExecContext(ctx, "CREATE DATABASE ha_fanout"); err != nil {
		t.Fatal(err)
	}
	open := func(node *testha.SQLServer) *stepmysql.Storage { return testkit.OpenStorage(t, mustOpen(t, node)) }
	if err := stepmysql.Migrate(ctx, mustOpen(t, g.Nodes[0])); err != nil {
		t.Fatal(err)
	}
	stores := []*stepmysql.Storage{open(g.Nodes[0]), open(g.Nodes[1])}

	const n = 200
	step := testkit.FanOut("galera", n, 2)
	if err := stores[0].StoreStep(ctx, step, time.Now()); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	completed := map[string]int{}
	var errs []error
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i, id := range step.IDs {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			// each enrollment's two results through different nodes
			for c := range 2 {
				r, err := stores[(i+c)%2].StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(step.Commands[c].CommandUUID))
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("enrollment %s, command %d: %w", id, c, err))
				}
				if r != nil {
					completed[id]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	for _, id := range step.IDs {
		if completed[id] != 1 {
			t.Errorf("enrollment %s completed %d times, want once", id, completed[id])
		}
	}
	third := mustOpen(t, g.Nodes[2])
	testkit.WaitUntil(t, 15*time.Second, "every row gone, read on the third node", func() (bool, any) {
		rows := testkit.CountStepRows(t, third)
		return rows == testkit.StepRows{}, rows
	})
}

// mustOpen is a pool on node's ha_fanout database.
func mustOpen(t *testing.T, node *testha.SQLServer) *sql.DB {
	t.Helper()
	cfg, err := mysql.ParseDSN(node.DSN())
	if err != nil {
		t.Fatal(err)
	}
	cfg.DBName, cfg.ParseTime = "ha_fanout", true
	db, err := stepmysql.OpenDB(cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// Ready, /readyz's mysql check: a synced Galera node is ready; the node
// left when two of three are killed has no quorum and refuses writes, and
// Ready says so (a ping alone still answers); bootstrapped as a primary
// component of its own it is ready again. On a server without Galera
// (the suite's) it is a ping.
func TestReadyIsFalseOnAGaleraNodeWithoutQuorum(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	if err := stepmysql.Ready(ctx, testkit.NewDB(t, nil).DB); err != nil {
		t.Fatalf("Ready on the suite's server: %v", err)
	}
	g := testha.StartGalera(t, 3)
	if _, err := g.Nodes[0].Admin.ExecContext(ctx, "CREATE DATABASE ha_fanout"); err != nil {
		t.Fatal(err)
	}
	db := mustOpen(t, g.Nodes[0])
	if err := stepmysql.Ready(ctx, db); err != nil {
		t.Fatalf("Ready on a synced node: %v", err)
	}
	g.Nodes[1].Kill()
	g.Nodes[2].Kill()
	testkit.WaitUntil(t, 30*time.Second, "node 0 out of the primary component", func() (bool, any) {
		err := stepmysql.Ready(ctx, db)
		return err != nil, err
	})
	err := stepmysql.Ready(ctx, db)
	if err == nil || !strings.Contains(err.Error(), "not in the primary component") {
		t.Errorf("Ready on a node without quorum: %v, want it to say so", err)
	}
	if perr := db.PingContext(ctx); perr != nil {
		t.Errorf("ping on a node without quorum: %v (a ping alone was never going to tell)", perr)
	}
	if _, err := g.Nodes[0].Admin.ExecContext(ctx, "SET GLOBAL wsrep_provider_options = 'pc.bootstrap=YES'"); err != nil {
		t.Fatal(err)
	}
	testkit.WaitUntil(t, 15*time.Second, "node 0 ready as a primary component of its own", func() (bool, any) {
		err := stepmysql.Ready(ctx, db)
		return err == nil, err
	})
}
