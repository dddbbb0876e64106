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
	// Network is the nodes' network (StartGaleraOnNetwork), nil on
	// loopback.
	Network *Network
}

// StartGalera starts an n-node cluster and returns once every node is
// Synced. The first node bootstraps the cluster; the others join it and
// take their state by mysqldump (rsync's daemon runs as nobody, who may
// not write a root-owned datadir). Every node is killed when t ends. It
// runs in the MariaDB suite (`make test`) and skips in the MySQL one,
// which would only run it again.
func StartGalera(t testing.TB, n int) *Galera {
	t.Helper()
	if SuiteKind(t) != MariaDB {
		t.Skip("Galera is MariaDB's: it runs in the MariaDB suite (make test)")
	}
	testkit.RequireBinary(t, "mariadbd", "mariadb-install-db", "mysqldump")
	if err := GaleraAvailable(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("galera-4 is required under CI: %v", err)
		}
		t.Skipf("no galera-4 (%v)", err)
	}
	g, err := newGalera(n, MariaDBConfig{}, t, nil)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// StartGaleraOnNetwork is StartGalera with each node in a host of its own
// on a private Network (g.Network), so that a test can cut one off
// (Host.Cut): it listens on its host's address, and root may connect from
// the network (root@'10.201.%'), as the joiners' state transfer and a
// balancer's check do; the test's own pool on each node is on its socket,
// which a cut leaves reachable.
func StartGaleraOnNetwork(t testing.TB, n int) *Galera {
	t.Helper()
	testkit.RequireBinary(t, "mariadbd", "mariadb-install-db", "mysqldump")
	if SuiteKind(t) != MariaDB {
		t.Skip("Galera is MariaDB's: it runs in the MariaDB suite (make test)")
	}
	if err := GaleraAvailable(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("galera-4 is required under CI: %v", err)
		}
		t.Skipf("no galera-4 (%v)", err)
	}
	nw := NewNetwork(t, n)
	// mariadb-install-db runs it with --skip-grant-tables, where CREATE
	// USER is refused: the row, as the install writes root's own
	g, err := newGalera(n, MariaDBConfig{InitSQL: `INSERT INTO mysql.global_priv (Host, User, Priv) ` +
		`VALUES ('10.201.%', 'root', '{"access":18446744073709551615}');` + "\n"}, t, nw)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// GaleraAvailable says why this machine cannot run a Galera node (nil
// when it can): Debian's galera-4 is not installed.
func GaleraAvailable() error {
	_, err := os.Stat(galeraProvider)
	return err
}

// RunGalera is StartGalera outside a test (the bench's), each node shaped
// by cfg (its Args come before the Galera options): the caller stops the
// nodes, and removes their files, with Stop.
func RunGalera(n int, cfg MariaDBConfig) (*Galera, error) {
	if err := GaleraAvailable(); err != nil {
		return nil, err
	}
	return newGalera(n, cfg, nil, nil)
}

// Stop kills every node of a cluster RunGalera started and removes its
// files.
func (g *Galera) Stop() {
	for _, n := range g.Nodes {
		n.Stop()
	}
}

// newGalera starts the nodes, in t (killed and removed when it ends) or,
// with t nil, for the caller to Stop.
func newGalera(n int, cfg MariaDBConfig, t testing.TB, nw *Network) (*Galera, error) {
	ips := make([]string, n)
	for i := range ips {
		ips[i] = "127.0.0.1"
		if nw != nil {
			ips[i] = nw.Hosts()[i].IP
		}
	}
	ports := make([]int, n)
	var peers []string
	for i := range n {
		var err error
		gcomm := 0
		if ports[i], err = testkit.PickPort(); err == nil {
			gcomm, err = testkit.PickPort()
		}
		if err != nil {
			return nil, err
		}
		peers = append(peers, ips[i]+":"+strconv.Itoa(gcomm))
	}
	g := &Galera{Network: nw}
	fail := func(err error) (*Galera, error) {
		if t == nil {
			g.Stop()
		}
		return nil, err
	}
	for i := range n {
		dir, err := os.MkdirTemp("", "testha-galera")
		if err != nil {
			return fail(err)
		}
		if t != nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
		}
		ist, err := testkit.PickPort()
		if err != nil {
			return fail(err)
		}
		args := append(slices.Clone(cfg.Args),
			"--wsrep-on=ON", "--wsrep-provider="+galeraProvider,
			"--wsrep-cluster-name=stepcollect-test", "--wsrep-cluster-address=gcomm://"+strings.Join(peers, ","),
			"--wsrep-node-address="+peers[i],
			fmt.Sprintf("--wsrep-provider-options=gmcast.listen_addr=tcp://%s;ist.recv_addr=%s:%d", peers[i], ips[i], ist),
			"--wsrep-sst-method=mysqldump", "--wsrep-sst-auth=root:", fmt.Sprintf("--wsrep-sst-receive-address=%s:%d", ips[i], ports[i]),
			// what Galera requires of every node
			"--binlog-format=ROW", "--innodb-autoinc-lock-mode=2",
		)
		if i == 0 {
			args = append(args, "--wsrep-new-cluster")
		}
		nc := cfg
		nc.Args = args
		s, err := newMariaDB(dir, ports[i], nc)
		if err != nil {
			os.RemoveAll(dir)
			return fail(err)
		}
		if nw != nil {
			s.onHost(nw.Hosts()[i], nw)
			// root's pool on the socket: a cut leaves it reachable
			s.adminNet, s.adminAddr = "unix", filepath.Join(dir, "sock")
		}
		if t != nil {
			s.t = t
			s.launch()
		} else {
			s.dir = dir
			if err := s.open(); err != nil {
				g.Nodes = append(g.Nodes, s)
				return fail(err)
			}
		}
		g.Nodes = append(g.Nodes, s)
	}
	for i, s := range g.Nodes {
		if err := s.awaitSynced(60 * time.Second); err != nil {
			return fail(fmt.Errorf("galera node %d: %w", i, err))
		}
	}
	// The cluster is formed: node 0, restarted after a kill, joins the
	// others as any node does. Bootstrapping again would make it a
	// cluster of its own.
	n0 := g.Nodes[0].proc
	n0.args = slices.DeleteFunc(slices.Clone(n0.args), func(a string) bool { return a == "--wsrep-new-cluster" })
	return g, nil
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
func (g *Galera) KillAll() { killAll(g.Nodes) }

// killAll SIGKILLs every one of servers at once, then waits for each to
// exit.
func killAll(servers []*SQLServer) {
	for _, s := range servers {
		s.proc.signal(syscall.SIGKILL)
	}
	for _, s := range servers {
		s.Kill() // waits for the exit
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
