package testha

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/tcpproxy"
)

// Group is a MySQL Group Replication group in single-primary mode: private
// mysqld members from scripts/mysql.sh's chroot, each with its own datadir,
// SQL and XCom ports; the member weights make member 1, then member 2, the
// next primary. In front of it is the Balancer, a TCP proxy whose health
// check follows the primary as HAProxy's MySQL check does (every 200 ms,
// over the network; closing the sessions it sent to the member before).
// Why not MySQL Router: docs/operations.md, "MySQL Group Replication".
type Group struct {
	Members  []*SQLServer
	Balancer *tcpproxy.Proxy
	// Network is the members' network when they run in hosts of their own
	// (GroupConfig.Partitionable), nil on loopback.
	Network *Network
	root    string
}

// GroupConfig shapes a Group.
type GroupConfig struct {
	Members int      // 3 when 0
	Args    []string // more flags for every member's mysqld
	// Partitionable runs each member in a host of its own on a private
	// Network, so that a test can cut one off (Host.Cut); the Balancer
	// stays on this machine's loopback, on the network's gateway side.
	Partitionable bool
}

const (
	// the account the members' distributed recovery connects as
	recoveryUser, recoveryPassword = "gr_recovery", "gr-recovery-pw"
	// the account the Balancer's health check connects as: no privilege,
	// it only reads @@super_read_only
	checkUser, checkPassword = "gr_check", "gr-check-pw"
)

// StartGroupReplication starts a group behind its Balancer and returns
// once every member is ONLINE. Everything is killed when t ends.
//
// It runs in the MySQL suite (`make test-mysql`, SuiteKind MySQL) and
// skips in `make test`, which never needs MySQL's chroot. There, a missing
// chroot skips t, except under CI=true, where it fails.
func StartGroupReplication(t testing.TB, cfg GroupConfig) *Group {
	t.Helper()
	if SuiteKind(t) != MySQL {
		t.Skip("Group Replication is MySQL's: it runs in the MySQL suite (make test-mysql)")
	}
	g, err := newGroup(mysqlChroot(t), cfg, t)
	if err != nil {
		t.Fatal(err)
	}
	g.startBalancer(t)
	return g
}

// RunGroupReplication is StartGroupReplication outside a test (the
// bench's): n members on loopback, each mysqld with args after the
// group's flags, and no Balancer (member 0 is the primary). The caller
// stops the members, and removes their files, with Stop.
func RunGroupReplication(n int, args ...string) (*Group, error) {
	root := cmp.Or(os.Getenv("STEPCOLLECT_MYSQL_CHROOT"), defaultMySQLChroot)
	if _, err := os.Stat(root + "/usr/sbin/mysqld"); err != nil {
		return nil, fmt.Errorf("MySQL's chroot (scripts/mysql.sh makes it, as root): %w", err)
	}
	g, err := newGroup(root, GroupConfig{Members: n, Args: args}, nil)
	if err != nil && g != nil {
		g.Stop()
	}
	return g, err
}

// Stop kills every member of a group RunGroupReplication started and
// removes its files.
func (g *Group) Stop() {
	for _, m := range g.Members {
		m.Stop()
	}
}

// newGroup starts the members and forms the group, in t (killed and
// removed when it ends) or, with t nil, for the caller to Stop.
func newGroup(root string, cfg GroupConfig, t testing.TB) (*Group, error) {
	n := cmp.Or(cfg.Members, 3)
	g := &Group{root: root}
	ips := make([]string, n)
	for i := range ips {
		ips[i] = "127.0.0.1"
	}
	if cfg.Partitionable {
		if t == nil {
			return nil, errors.New("group: a partitionable group needs a test")
		}
		g.Network = NewNetwork(t, n)
		for i, h := range g.Network.Hosts() {
			ips[i] = h.IP
		}
	}
	ports := make([]int, n)
	seeds := make([]string, n)
	for i := range n {
		// free here; in a host of its own nothing else listens
		p, err := testkit.PickPort()
		if err == nil {
			ports[i] = p
			p, err = testkit.PickPort()
		}
		if err != nil {
			return g, err
		}
		seeds[i] = ips[i] + ":" + strconv.Itoa(p)
	}
	uuid := make([]byte, 16)
	rand.Read(uuid)
	name := fmt.Sprintf("%x-%x-%x-%x-%x", uuid[0:4], uuid[4:6], uuid[6:8], uuid[8:10], uuid[10:])

	for i := range n {
		args := []string{
			"--server-id=" + strconv.Itoa(i+1),
			"--gtid-mode=ON", "--enforce-gtid-consistency=ON",
			"--plugin-load-add=group_replication.so",
			"--group-replication-group-name=" + name,
			"--group-replication-local-address=" + seeds[i],
			"--group-replication-group-seeds=" + strings.Join(seeds, ","),
			"--group-replication-single-primary-mode=ON",
			// started by hand: the first member bootstraps, the others
			// join, and a killed one rejoins (Rejoin)
			"--group-replication-start-on-boot=OFF",
			// the election order: member 1, then member 2
			"--group-replication-member-weight=" + strconv.Itoa(90-20*i),
			// distributed recovery connects to the donor as a client:
			// here, by address, and caching_sha2 without TLS needs the
			// donor's public key
			"--report-host=" + ips[i], "--report-port=" + strconv.Itoa(ports[i]),
			"--group-replication-recovery-get-public-key=ON",
			// a member starts refusing writes, and the group lifts that
			// on the primary alone: without it a member restarted after
			// a crash, not yet in the group, takes writes of its own
			// (the whole-group reboot found it: the balancer sent the
			// api to the first member up, which diverged)
			"--super-read-only=ON",
		}
		var s *SQLServer
		if t != nil {
			s = newMySQL(t, root, ports[i], append(args, cfg.Args...))
		} else {
			var err error
			if s, err = newMySQLAt(root, ports[i], append(args, cfg.Args...)); err != nil {
				if s != nil {
					os.RemoveAll(s.dir)
				}
				return g, err
			}
		}
		if g.Network != nil {
			s.onHost(g.Network.Hosts()[i], g.Network)
		}
		g.Members = append(g.Members, s)
		if t != nil {
			s.launch()
		} else if err := s.open(); err != nil {
			return g, err
		}
	}
	for i, s := range g.Members {
		if err := s.prepareMember(); err != nil {
			return g, fmt.Errorf("group member %d: %w", i, err)
		}
	}
	for i, s := range g.Members {
		var err error
		if i == 0 {
			err = s.execOnOne("SET GLOBAL group_replication_bootstrap_group = ON",
				"START GROUP_REPLICATION", "SET GLOBAL group_replication_bootstrap_group = OFF")
		} else {
			err = s.execOnOne("START GROUP_REPLICATION")
		}
		if err != nil {
			return g, fmt.Errorf("group member %d: %w", i, err)
		}
	}
	return g, g.AwaitOnline(n, 0, 90*time.Second)
}

// startBalancer starts the Balancer on the primary and its health check,
// both stopped when t ends.
func (g *Group) startBalancer(t testing.TB) {
	t.Helper()
	checks := make([]*sql.DB, len(g.Members))
	for i, s := range g.Members {
		cfg := mysql.NewConfig()
		cfg.User, cfg.Passwd, cfg.Net, cfg.Addr = checkUser, checkPassword, "tcp", s.addr()
		cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout = time.Second, time.Second, time.Second
		db, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxIdleConns(0) // a connection of its own for each check, as a balancer's
		checks[i] = db
	}
	primary := g.Members[0].addr()
	g.Balancer = tcpproxy.Start(t, primary)
	stop, stopped := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		close(stop)
		<-stopped
		for _, db := range checks {
			db.Close()
		}
	})
	go func() {
		defer close(stopped)
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for i, db := range checks {
				var readOnly int
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				err := db.QueryRowContext(ctx, "SELECT @@super_read_only").Scan(&readOnly)
				cancel()
				if err == nil && readOnly == 0 {
					if addr := g.Members[i].addr(); addr != primary {
						primary = addr
						g.Balancer.Move(addr)
					}
					break
				}
			}
		}
	}()
}

// prepareMember creates the recovery account and the health check's,
// outside the binary log so that each member has its own, and names the
// former for the recovery channel; super_read_only is lifted for that
// alone.
func (s *SQLServer) prepareMember() error {
	return s.execOnOne(
		"SET GLOBAL super_read_only = OFF",
		"SET SQL_LOG_BIN = 0",
		// from any member: on loopback or from a host of its own
		fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", recoveryUser, recoveryPassword),
		fmt.Sprintf("GRANT REPLICATION SLAVE ON *.* TO '%s'@'%%'", recoveryUser),
		fmt.Sprintf("CREATE USER '%s'@'%%' IDENTIFIED BY '%s'", checkUser, checkPassword),
		"SET SQL_LOG_BIN = 1",
		fmt.Sprintf("CHANGE REPLICATION SOURCE TO SOURCE_USER = '%s', SOURCE_PASSWORD = '%s' FOR CHANNEL 'group_replication_recovery'",
			recoveryUser, recoveryPassword),
		"SET GLOBAL super_read_only = ON",
	)
}

// execOnOne runs statements in order on one connection (SQL_LOG_BIN is
// the session's).
func (s *SQLServer) execOnOne(stmts ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, err := s.Admin.Conn(ctx)
	if err != nil {
		return err
	}
	defer c.Close()
	for _, q := range stmts {
		if _, err := c.ExecContext(ctx, q); err != nil {
			b, _ := os.ReadFile(s.errorLog)
			return fmt.Errorf("%s: %w\n%s", q, err, tail(string(b), 30))
		}
	}
	return nil
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Member is one row of the group's membership as a member sees it.
type Member struct {
	Port  int
	State string // ONLINE, RECOVERING, UNREACHABLE, ERROR, OFFLINE
	Role  string // PRIMARY, SECONDARY
}

// Membership is the group as member i sees it (nil while it cannot say).
func (g *Group) Membership(i int) []Member {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rows, err := g.Members[i].Admin.QueryContext(ctx,
		"SELECT MEMBER_PORT, MEMBER_STATE, MEMBER_ROLE FROM performance_schema.replication_group_members")
	if err != nil {
		return nil
	}
	defer rows.Close()
	var out []Member
	for rows.Next() {
		var m Member
		var port sql.NullInt64
		var role sql.NullString
		if err := rows.Scan(&port, &m.State, &role); err != nil {
			return nil
		}
		m.Port, m.Role = int(port.Int64), role.String
		out = append(out, m)
	}
	return out
}

// Primary is the index of the member that member i sees as the ONLINE
// primary, or -1.
func (g *Group) Primary(i int) int {
	for _, m := range g.Membership(i) {
		if m.Role == "PRIMARY" && m.State == "ONLINE" {
			for j, s := range g.Members {
				if s.Port == m.Port {
					return j
				}
			}
		}
	}
	return -1
}

// AwaitOnline waits until member i sees n members ONLINE.
func (g *Group) AwaitOnline(n, i int, within time.Duration) error {
	var last []Member
	if _, ok := testkit.Watch(time.Now().Add(within), func() bool {
		last = g.Membership(i)
		online := 0
		for _, m := range last {
			if m.State == "ONLINE" {
				online++
			}
		}
		return online == n
	}); !ok {
		b, _ := os.ReadFile(g.Members[i].errorLog)
		return fmt.Errorf("group: member %d does not see %d members ONLINE within %v (it sees %v):\n%s", i, n, within, last, tail(string(b), 40))
	}
	return nil
}

// Rejoin starts a killed member again and has it rejoin the group (it
// takes what it missed from a donor), returning once member i sees every
// member ONLINE.
func (g *Group) Rejoin(i int, within time.Duration) error {
	if err := g.Members[i].Restart(); err != nil {
		return err
	}
	if err := g.Members[i].execOnOne("START GROUP_REPLICATION"); err != nil {
		return fmt.Errorf("group member %d rejoining: %w", i, err)
	}
	return g.AwaitOnline(len(g.Members), i, within)
}

// KillAll SIGKILLs every member at once: the whole group lost, as a power
// cut does to a rack.
func (g *Group) KillAll() { killAll(g.Members) }

// RestartAll reboots a group whose members were all killed, as its
// operator must: every member started again (outside the group: it does
// not start on boot), the one holding every transaction any member has
// (its gtid_executed with what it had received and not applied, a superset
// of every other member's) bootstraps the group, and the others join it.
// It returns the index of the member that bootstrapped, once every member
// is ONLINE.
func (g *Group) RestartAll(within time.Duration) (int, error) {
	// all at once: each one's crash recovery takes seconds
	errs := make([]error, len(g.Members))
	var wg sync.WaitGroup
	for i, m := range g.Members {
		wg.Go(func() { errs[i] = m.Restart() })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return -1, fmt.Errorf("group member %d: %w", i, err)
		}
	}
	sets := make([]string, len(g.Members))
	for i, m := range g.Members {
		var executed string
		var received sql.NullString
		err := m.Admin.QueryRow("SELECT @@GLOBAL.gtid_executed").Scan(&executed)
		if err == nil {
			err = m.Admin.QueryRow(`SELECT received_transaction_set FROM performance_schema.replication_connection_status
				WHERE channel_name = 'group_replication_applier'`).Scan(&received)
			if errors.Is(err, sql.ErrNoRows) {
				err = nil
			}
		}
		if err != nil {
			return -1, fmt.Errorf("group member %d: reading its GTIDs: %w", i, err)
		}
		sets[i] = strings.Trim(executed+","+received.String, ",")
	}
	best := -1
	for i := range sets {
		all := true
		for j := range sets {
			var subset bool
			if err := g.Members[i].Admin.QueryRow("SELECT GTID_SUBSET(?, ?)", sets[j], sets[i]).Scan(&subset); err != nil {
				return -1, fmt.Errorf("group member %d: comparing GTID sets: %w", i, err)
			}
			all = all && subset
		}
		if all {
			best = i
			break
		}
	}
	if best < 0 {
		return -1, fmt.Errorf("group: no member holds every other member's transactions (%q)", sets)
	}
	if err := g.Members[best].execOnOne("SET GLOBAL group_replication_bootstrap_group = ON",
		"START GROUP_REPLICATION", "SET GLOBAL group_replication_bootstrap_group = OFF"); err != nil {
		return best, fmt.Errorf("group member %d bootstrapping: %w", best, err)
	}
	for i, m := range g.Members {
		if i != best {
			if err := m.execOnOne("START GROUP_REPLICATION"); err != nil {
				return best, fmt.Errorf("group member %d joining: %w", i, err)
			}
		}
	}
	return best, g.AwaitOnline(len(g.Members), best, within)
}
