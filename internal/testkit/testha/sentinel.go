package testha

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// Redis is one redis-server process: a data node or a Sentinel.
type Redis struct {
	t    testing.TB
	Name string
	Port int
	proc *process

	once sync.Once
	conn *respConn
}

// Addr is 127.0.0.1:Port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.Port)) }

func (r *Redis) start() {
	r.t.Helper()
	if err := r.proc.start(); err != nil {
		r.t.Fatalf("starting %s: %v", r.Name, err)
	}
	if !awaitTCP(r.Addr(), 10*time.Second, r.proc.running) {
		r.t.Fatalf("%s on %s did not answer:\n%s", r.Name, r.Addr(), r.Logs())
	}
}

// Kill stops the process with SIGKILL: no goodbye to its clients, nothing
// saved (the data nodes run without persistence).
func (r *Redis) Kill() { r.proc.stop(syscall.SIGKILL, 5*time.Second) }

// Freeze stops the process with SIGSTOP: its sockets stay open and the
// kernel still accepts connections for it, but nothing is answered, as
// with a host that hangs or a network that drops packets.
func (r *Redis) Freeze() { r.proc.signal(syscall.SIGSTOP) }

// Thaw resumes a frozen process (SIGCONT): it answers what was sent to it
// meanwhile, still believing what it believed.
func (r *Redis) Thaw() { r.proc.signal(syscall.SIGCONT) }

// Restart starts the process again, on the same port with the same
// arguments as at first (a data node that was the primary comes back
// configured as a primary, as its own configuration file would say).
func (r *Redis) Restart() {
	r.t.Helper()
	r.Kill()
	r.start()
}

// Running reports whether the process runs.
func (r *Redis) Running() bool { return r.proc.running() }

// Logs is everything the process wrote so far.
func (r *Redis) Logs() string { return r.proc.logs.String() }

// Do sends one command to this process and returns its reply: a string,
// an int64, a []any, nil, or a ReplyError.
func (r *Redis) Do(ctx context.Context, args ...string) (any, error) {
	r.once.Do(func() { r.conn = &respConn{addr: r.Addr()} })
	return r.conn.do(ctx, args...)
}

// Role is the node's ROLE: "master", or "slave" with the primary it
// follows and the link's state ("connected" once in sync).
type Role struct {
	Role      string
	Primary   string // host:port, for a replica
	LinkState string // for a replica: connect, connecting, sync, connected
}

// Role asks the node for its ROLE.
func (r *Redis) Role(ctx context.Context) (Role, error) {
	reply, err := r.Do(ctx, "ROLE")
	if err != nil {
		return Role{}, err
	}
	v, _ := reply.([]any)
	if len(v) == 0 {
		return Role{}, fmt.Errorf("ROLE: unexpected answer %v", reply)
	}
	role := Role{Role: fmt.Sprint(v[0])}
	if role.Role == "slave" && len(v) >= 4 {
		role.Primary = net.JoinHostPort(fmt.Sprint(v[1]), fmt.Sprint(v[2]))
		role.LinkState = fmt.Sprint(v[3])
	}
	return role, nil
}

func (r *Redis) close() {
	r.once.Do(func() {})
	if r.conn != nil {
		r.conn.close()
	}
}

// SentinelConfig sizes a Sentinel setup. The zero value is three
// Sentinels, quorum two, down-after 1 s, failover-timeout 5 s.
type SentinelConfig struct {
	Sentinels       int
	Quorum          int
	DownAfter       time.Duration
	FailoverTimeout time.Duration
}

// Sentinel is a Redis primary, one replica and the Sentinels that watch
// them under the master name Master.
type Sentinel struct {
	t         testing.TB
	cfg       SentinelConfig
	Master    string
	Servers   []*Redis // [0] the primary at start, [1] its replica
	Sentinels []*Redis
	// URL is the redis-sentinel:// URL of every Sentinel, as
	// asynq.ParseRedisURI (and so -redis-url) takes it.
	URL string
}

// StartSentinel starts the primary, its replica and the Sentinels, and
// returns once the replica is in sync and every Sentinel knows the others,
// the replica, and that a failover could be authorised.
func StartSentinel(t testing.TB, cfg SentinelConfig) *Sentinel {
	t.Helper()
	testkit.RequireBinary(t, "redis-server")
	if cfg.Sentinels <= 0 {
		cfg.Sentinels = 3
	}
	if cfg.Quorum <= 0 {
		cfg.Quorum = cfg.Sentinels/2 + 1
	}
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = time.Second
	}
	if cfg.FailoverTimeout <= 0 {
		cfg.FailoverTimeout = 5 * time.Second
	}
	dir := t.TempDir()
	s := &Sentinel{t: t, cfg: cfg, Master: "m"}
	t.Cleanup(func() {
		for _, r := range append(append([]*Redis(nil), s.Sentinels...), s.Servers...) {
			r.close()
			r.Kill()
		}
		if t.Failed() {
			for _, r := range append(append([]*Redis(nil), s.Servers...), s.Sentinels...) {
				t.Logf("%s (%s) output:\n%s", r.Name, r.Addr(), r.Logs())
			}
		}
	})

	newServer := func(name string, extra ...string) *Redis {
		port := testkit.FreePort(t)
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "no",
			"--save", "", "--appendonly", "no", "--dir", d, "--daemonize", "no", "--loglevel", "notice"}, extra...)
		r := &Redis{t: t, Name: name, Port: port, proc: newProcess(name, "redis-server", args...)}
		s.Servers = append(s.Servers, r)
		r.start()
		return r
	}
	primary := newServer("redis-a")
	replica := newServer("redis-b", "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	if _, err := s.AwaitReplica(replica, primary, 30*time.Second); err != nil {
		t.Fatal(err)
	}

	var addrs []string
	for i := range cfg.Sentinels {
		name := fmt.Sprintf("sentinel-%d", i+1)
		port := testkit.FreePort(t)
		d := filepath.Join(dir, name)
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		// Sentinel rewrites its configuration file (what it learns, the
		// current epoch), so each has its own, writable.
		conf := filepath.Join(d, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
daemonize no
dir %s
loglevel notice
logfile ""
sentinel resolve-hostnames no
sentinel monitor %s 127.0.0.1 %d %d
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, port, d, s.Master, primary.Port, cfg.Quorum, s.Master, cfg.DownAfter.Milliseconds(), s.Master, cfg.FailoverTimeout.Milliseconds(), s.Master)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		r := &Redis{t: t, Name: name, Port: port, proc: newProcess(name, "redis-server", conf, "--sentinel")}
		s.Sentinels = append(s.Sentinels, r)
		r.start()
		addrs = append(addrs, r.Addr())
	}
	s.URL = "redis-sentinel://" + strings.Join(addrs, ",") + "?master=" + s.Master
	if _, err := s.AwaitHealthy(replica, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

// Server is the data node at addr (host:port), or nil.
func (s *Sentinel) Server(addr string) *Redis {
	for _, r := range s.Servers {
		if r.Addr() == addr {
			return r
		}
	}
	return nil
}

// MasterAddrs asks every Sentinel for the primary's address
// (SENTINEL get-master-addr-by-name); an unreachable one answers "".
func (s *Sentinel) MasterAddrs(ctx context.Context) []string {
	out := make([]string, len(s.Sentinels))
	for i, r := range s.Sentinels {
		reply, err := r.Do(ctx, "SENTINEL", "get-master-addr-by-name", s.Master)
		if v, ok := reply.([]any); err == nil && ok && len(v) == 2 {
			out[i] = net.JoinHostPort(fmt.Sprint(v[0]), fmt.Sprint(v[1]))
		}
	}
	return out
}

// Promotion is how a change of primary was seen.
type Promotion struct {
	To string
	// First is when the first Sentinel named the new primary (what a
	// client asking that Sentinel then dials), All when every one did.
	First, All time.Time
}

// AwaitPromotion asks the Sentinels every 20 ms until one names a primary
// other than from, and then until all do; it gives up after within.
func (s *Sentinel) AwaitPromotion(from string, within time.Duration) (Promotion, error) {
	deadline := time.Now().Add(within)
	var p Promotion
	var last []string
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		last = s.MasterAddrs(ctx)
		cancel()
		now := time.Now()
		all := true
		for _, a := range last {
			if a != "" && a != from {
				if p.First.IsZero() {
					p.First, p.To = now, a
				}
			} else {
				all = false
			}
		}
		if all {
			p.All = now
			if !allSame(last) {
				return p, fmt.Errorf("the Sentinels name different primaries: %v", last)
			}
			return p, nil
		}
		if now.After(deadline) {
			return p, fmt.Errorf("no promotion away from %s within %v: the Sentinels name %v", from, within, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allSame(xs []string) bool {
	for _, x := range xs {
		if x != xs[0] {
			return false
		}
	}
	return true
}

// AwaitReplica waits until node is a replica of primary with its link up
// (ROLE says "connected") and reports how long that took.
func (s *Sentinel) AwaitReplica(node, primary *Redis, within time.Duration) (time.Duration, error) {
	start := time.Now()
	var last string
	if _, ok := testkit.Watch(start.Add(within), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		role, err := node.Role(ctx)
		cancel()
		last = fmt.Sprintf("%+v %v", role, err)
		return err == nil && role.Role == "slave" && role.Primary == primary.Addr() && role.LinkState == "connected"
	}); !ok {
		return time.Since(start), fmt.Errorf("%s is not an in-sync replica of %s within %v (ROLE: %s)", node.Name, primary.Name, within, last)
	}
	return time.Since(start), nil
}

// AwaitHealthy waits until every Sentinel names the same primary, lists
// replica as a healthy replica of it (no s_down, not disconnected, link
// ok), knows every other Sentinel, and says a failover could be authorised
// (SENTINEL CKQUORUM). That is what a failover, automatic or asked for,
// needs.
func (s *Sentinel) AwaitHealthy(replica *Redis, within time.Duration) (time.Duration, error) {
	start := time.Now()
	var why string
	if _, ok := testkit.Watch(start.Add(within), func() bool { why = s.unhealthy(replica); return why == "" }); !ok {
		return time.Since(start), fmt.Errorf("sentinel setup not healthy within %v: %s", within, why)
	}
	return time.Since(start), nil
}

func (s *Sentinel) unhealthy(replica *Redis) string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addrs := s.MasterAddrs(ctx)
	if !allSame(addrs) || addrs[0] == "" {
		return fmt.Sprintf("primaries named: %v", addrs)
	}
	if addrs[0] == replica.Addr() {
		return fmt.Sprintf("%s is the primary, not a replica", replica.Name)
	}
	for _, r := range s.Sentinels {
		others, err := r.Do(ctx, "SENTINEL", "sentinels", s.Master)
		if xs, _ := others.([]any); err != nil || len(xs) != len(s.Sentinels)-1 {
			return fmt.Sprintf("%s knows %d other Sentinels (%v)", r.Name, len(xs), err)
		}
		reps, err := r.Do(ctx, "SENTINEL", "replicas", s.Master)
		if err != nil {
			return fmt.Sprintf("%s: SENTINEL replicas: %v", r.Name, err)
		}
		found := false
		xs, _ := reps.([]any)
		for _, x := range xs {
			rep := kv(x)
			if net.JoinHostPort(rep["ip"], rep["port"]) == replica.Addr() {
				if rep["flags"] != "slave" || rep["master-link-status"] != "ok" {
					return fmt.Sprintf("%s sees %s as flags=%s master-link-status=%s", r.Name, replica.Name, rep["flags"], rep["master-link-status"])
				}
				found = true
			}
		}
		if !found {
			return fmt.Sprintf("%s does not list %s as a replica", r.Name, replica.Name)
		}
		if _, err := r.Do(ctx, "SENTINEL", "ckquorum", s.Master); err != nil {
			return fmt.Sprintf("%s: CKQUORUM: %v", r.Name, err)
		}
	}
	return ""
}

// Failover asks a Sentinel for a failover (SENTINEL FAILOVER), as an
// operator does before maintenance, trying again while the Sentinel
// answers that one is in progress or no replica is fit yet, up to within.
func (s *Sentinel) Failover(within time.Duration) error {
	deadline := time.Now().Add(within)
	for i := 0; ; i++ {
		r := s.Sentinels[i%len(s.Sentinels)]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := r.Do(ctx, "SENTINEL", "failover", s.Master)
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("SENTINEL FAILOVER %s on %s: %v", s.Master, r.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Events is the Sentinels' log lines about the primary's fate (+sdown,
// +odown, +try-failover, +elected-leader, +selected-slave,
// +promoted-slave, +switch-master, +convert-to-slave, +failover-end …),
// each Sentinel's prefixed with its name, in the order written.
func (s *Sentinel) Events() []string {
	var out []string
	for _, r := range s.Sentinels {
		for _, line := range strings.Split(r.Logs(), "\n") {
			for _, ev := range []string{"+sdown master", "-sdown master", "+odown", "+try-failover", "+elected-leader", "+selected-slave",
				"+promoted-slave", "+switch-master", "+convert-to-slave", "+failover-end", "+failover-state-reconf-slaves", "-failover-abort"} {
				if strings.Contains(line, ev) {
					out = append(out, r.Name+": "+strings.TrimSpace(line))
					break
				}
			}
		}
	}
	return out
}
