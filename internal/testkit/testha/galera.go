package testha

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
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

// KillAll SIGKILLs every node at once: the whole cluster lost, as a power
// cut does to a rack.
func (g *Galera) KillAll() {
	for _, n := range g.Nodes {
		n.proc.signal(syscall.SIGKILL)
	}
	for _, n := range g.Nodes {
		n.Kill() // waits for the exit
	}
}

// RestartAll starts a cluster whose nodes were all killed, as its operator
// must: every node's last committed position recovered (mariadbd
// --wsrep-recover), the most advanced one marked safe to bootstrap in its
// grastate.dat and started as a new cluster, the others joining it. It
// returns the index of the node that bootstrapped, once every node is
// Synced.
func (g *Galera) RestartAll(within time.Duration) (int, error) {
	best, bestSeqno := -1, int64(-2)
	for i, n := range g.Nodes {
		seqno, err := n.recoverPosition()
		if err != nil {
			return -1, fmt.Errorf("galera node %d: %w", i, err)
		}
		if seqno > bestSeqno {
			best, bestSeqno = i, seqno
		}
	}
	n := g.Nodes[best]
	state := filepath.Join(n.datadir(), "grastate.dat")
	b, err := os.ReadFile(state)
	if err != nil {
		return best, err
	}
	if err := os.WriteFile(state, []byte(strings.Replace(string(b), "safe_to_bootstrap: 0", "safe_to_bootstrap: 1", 1)), 0o644); err != nil {
		return best, err
	}
	args := n.proc.args
	n.proc.args = append(slices.Clone(args), "--wsrep-new-cluster")
	err = n.start()
	n.proc.args = args // a later restart joins
	if err != nil {
		return best, fmt.Errorf("galera node %d bootstrapping: %w", best, err)
	}
	if err := n.awaitSynced(within); err != nil {
		return best, fmt.Errorf("galera node %d bootstrapping: %w", best, err)
	}
	for i, m := range g.Nodes {
		if i == best {
			continue
		}
		if err := m.start(); err != nil {
			return best, fmt.Errorf("galera node %d joining: %w", i, err)
		}
	}
	for i, m := range g.Nodes {
		if err := m.awaitSynced(within); err != nil {
			return best, fmt.Errorf("galera node %d: %w", i, err)
		}
	}
	return best, nil
}

// recoverPosition runs the stopped node's mariadbd with --wsrep-recover,
// which reads InnoDB's last committed Galera position and exits, and
// returns its seqno.
func (s *SQLServer) recoverPosition() (int64, error) {
	log := filepath.Join(filepath.Dir(s.errorLog), "recover.log")
	args := slices.DeleteFunc(slices.Clone(s.proc.args), func(a string) bool { return strings.HasPrefix(a, "--log-error=") })
	args = append(args, "--log-error="+log, "--wsrep-recover")
	if out, err := exec.Command(s.proc.bin, args...).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("mariadbd --wsrep-recover: %v\n%s", err, out)
	}
	b, err := os.ReadFile(log)
	if err != nil {
		return 0, err
	}
	text := string(b)
	i := strings.LastIndex(text, "Recovered position: ")
	if i < 0 {
		return 0, fmt.Errorf("mariadbd --wsrep-recover printed no position:\n%s", text)
	}
	pos := strings.Fields(text[i+len("Recovered position: "):])[0] // uuid:seqno
	seqno, err := strconv.ParseInt(pos[strings.LastIndex(pos, ":")+1:], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("recovered position %q: %w", pos, err)
	}
	return seqno, nil
}

// datadir is the node's --datadir.
func (s *SQLServer) datadir() string {
	for _, a := range s.proc.args {
		if d, ok := strings.CutPrefix(a, "--datadir="); ok {
			return d
		}
	}
	return ""
}
