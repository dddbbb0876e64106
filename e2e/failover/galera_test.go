package failover

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// A three-node MariaDB Galera cluster with the real binaries on two of its
// nodes, unchanged: the api on node 0's address, the worker on node 1's
// (so that every step the api commits is collected, and every event
// delivered, through another node). Node 2 is SIGKILLed in the middle of
// the results and started again once they are all answered.
//
// The two nodes left keep the quorum, so every webhook answers 200; every
// result answered 200 is committed (read back row by row); within 15 s of
// the last answer every step is collected and every event delivered, each
// completion under one event id; and the restarted node, once it has
// caught up, holds no step row either.
func TestGaleraNodeKilledInTheMiddleOfAFanOut(t *testing.T) {
	g := testha.StartGalera(t, 3)
	appDSN, rootDSN := g.Nodes[0].NewDatabase(t, nil)
	// the test's own view reads causally too (OpenDB), or it could read
	// what node 0 has not applied yet
	root, err := stepmysql.OpenDB(rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	cfg, err := mysql.ParseDSN(appDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = fmt.Sprintf("127.0.0.1:%d", g.Nodes[1].Port)
	rs := testkit.StartRedis(t)
	s := testkit.StartStack(t, testkit.StackConfig{DSN: appDSN, RedisURL: rs.URL, DB: root, APIKey: apiKey,
		Receiver: &testkit.ReceiverOptions{CompletionsOnly: true}, WorkerArgs: []string{"-mysql-dsn", cfg.FormatDSN()}})
	s.Client.WithTimeout(30 * time.Second)
	const name = "Galera node 2 of 3 killed"

	r := s.EnqueueRound(t, "GA", enrollments())
	began := time.Now()
	done := s.Stream(r.Results(), 4*time.Second, 32)
	time.Sleep(time.Until(began.Add(1500 * time.Millisecond)))
	g.Nodes[2].Kill()
	killedAt := time.Now()
	answers := <-done
	if size := g.Nodes[0].Status("wsrep_cluster_size"); size != "2" {
		t.Errorf("%s: the cluster has %q members after the results, want 2: the kill did not take", name, size)
	}
	lastAnswer := killedAt
	bad := 0
	for _, a := range answers {
		if a.End.After(lastAnswer) {
			lastAnswer = a.End
		}
		if a.Err != nil || a.Status != http.StatusOK {
			if bad++; bad <= 10 {
				t.Errorf("%s: webhook %s answered %d %q %v: with two of three nodes a 200 was due", name, a.X, a.Status, a.Body, a.Err)
			}
		}
	}
	afterKill := 0
	for _, a := range answers {
		if a.Start.After(killedAt) {
			afterKill++
		}
	}
	if afterKill == 0 {
		t.Fatalf("%s: no webhook was sent after the kill: the test did not test", name)
	}
	checkNothingHalfWritten(t, s, name, answers, killedAt)
	st := s.AwaitSettled(t, lastAnswer, name, func() { s.Explain(t, lastAnswer, nil) })
	s.CheckReceiver(t)

	if err := g.Nodes[2].Restart(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitUntil(t, 60*time.Second, "the restarted node caught up, without step rows", func() (bool, any) {
		state := g.Nodes[2].Status("wsrep_local_state_comment")
		var steps int
		err := g.Nodes[2].Admin.QueryRow("SELECT COUNT(*) FROM " + cfg.DBName + ".steps").Scan(&steps)
		return state == "Synced" && err == nil && steps == 0, fmt.Sprintf("%s, %d steps, %v", state, steps, err)
	})
	t.Logf("FAILOVER %s: %d results, %d sent after the kill, %d not 200; %s (from the last answer)", name, len(answers), afterKill, bad, st)
	s.StillRunning(t)
	if !t.Failed() {
		s.Stop(t)
	}
}
