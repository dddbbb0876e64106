package testha

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// galeraProvider is Debian's galera-4 library.
const galeraProvider = "/usr/lib/galera/libgalera_smm.so"

// Galera is a MariaDB Galera cluster of private mariadbd nodes on this
// machine, each with its own datadir and ports: its SQL port, the group
// communication port (gmcast) and the incremental state transfer port.
type Galera struct {
	Nodes []*SQLServer
}

// StartGalera starts an n-node cluster and returns once every node is
// Synced. The first node bootstraps the cluster; the others join it and
// take their state by mysqldump (rsync's daemon runs as nobody, who may
// not write a root-owned datadir). Every node is killed when t ends.
func StartGalera(t testing.TB, n int) *Galera {
	t.Helper()
	testkit.RequireBinary(t, "mariadbd", "mariadb-install-db", "mysqldump")
	if _, err := os.Stat(galeraProvider); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("galera-4 is required under CI: %v", err)
		}
		t.Skipf("no galera-4 (%v)", err)
	}
	gcomm := make([]int, n)
	ports := make([]int, n)
	var peers []string
	for i := range n {
		ports[i], gcomm[i] = testkit.FreePort(t), testkit.FreePort(t)
		peers = append(peers, "127.0.0.1:"+strconv.Itoa(gcomm[i]))
	}
	g := &Galera{}
	for i := range n {
		dir, err := os.MkdirTemp("", "testha-galera")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		ist := testkit.FreePort(t)
		args := []string{
			"--wsrep-on=ON", "--wsrep-provider=" + galeraProvider,
			"--wsrep-cluster-name=stepcollect-test", "--wsrep-cluster-address=gcomm://" + strings.Join(peers, ","),
			"--wsrep-node-address=" + peers[i],
			fmt.Sprintf("--wsrep-provider-options=gmcast.listen_addr=tcp://%s;ist.recv_addr=127.0.0.1:%d", peers[i], ist),
			"--wsrep-sst-method=mysqldump", "--wsrep-sst-auth=root:", fmt.Sprintf("--wsrep-sst-receive-address=127.0.0.1:%d", ports[i]),
			// what Galera requires of every node
			"--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
		}
		if i == 0 {
			args = append(args, "--wsrep-new-cluster")
		}
		s, err := newMariaDB(dir, ports[i], MariaDBConfig{Args: args})
		if err != nil {
			t.Fatal(err)
		}
		s.t = t
		s.launch()
		g.Nodes = append(g.Nodes, s)
	}
	for i, s := range g.Nodes {
		if err := s.awaitSynced(60 * time.Second); err != nil {
			t.Fatalf("galera node %d: %v", i, err)
		}
	}
	// The cluster is formed: node 0, restarted after a kill, joins the
	// others as any node does. Bootstrapping again would make it a
	// cluster of its own.
	n0 := g.Nodes[0].proc
	n0.args = slices.DeleteFunc(slices.Clone(n0.args), func(a string) bool { return a == "--wsrep-new-cluster" })
	return g
}

// Status is a wsrep status variable of the node (wsrep_cluster_size,
// wsrep_local_state_comment, …), or "" while it cannot be read.
func (s *SQLServer) Status(name string) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var k, v string
	// a literal: SHOW takes no placeholder (the name is the caller's own)
	if err := s.Admin.QueryRowContext(ctx, "SHOW GLOBAL STATUS LIKE '"+name+"'").Scan(&k, &v); err != nil {
		return ""
	}
	return v
}

// awaitSynced waits until the node has taken its state and applies the
// cluster's writes (wsrep_local_state_comment Synced).
func (s *SQLServer) awaitSynced(within time.Duration) error {
	last := ""
	if _, ok := testkit.Watch(time.Now().Add(within), func() bool {
		last = s.Status("wsrep_local_state_comment")
		return last == "Synced" || !s.proc.running()
	}); !ok || last != "Synced" {
		b, _ := os.ReadFile(s.errorLog)
		return fmt.Errorf("not Synced within %v (state %q, running %v):\n%s", within, last, s.proc.running(), b)
	}
	return nil
}
