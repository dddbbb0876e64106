package testha

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Network is a private network on this machine for one test: a bridge,
// with this process's side of it at .1, and hosts in network namespaces of
// their own, each joined to the bridge by a veth pair. A server started in
// a host listens on the host's address only; everything else (this
// process, the api, Router) reaches it across the bridge, and Cut takes
// the host off it: every packet to and from it dropped, as a partition
// does, while its files and its Unix socket stay reachable (a socket path
// is not bound to a network namespace), so a test can still ask it what it
// sees.
type Network struct {
	// Gateway is this process's address on the bridge: where the hosts'
	// connections come from.
	Gateway string
	bridge  string
	prefix  string // 10.201.X.
	hosts   []*Host
}

// Host is one network namespace on a Network.
type Host struct {
	IP   string
	ns   string
	link string // this side of its veth pair, on the bridge
}

// ip runs iproute2's ip with args.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// NewNetwork makes a bridge with n hosts on a /24 of 10.201.0.0/16 that
// nothing on the machine routes yet, all removed when t ends. It needs
// root and iproute2: without them t skips, except under CI=true, where it
// fails.
func NewNetwork(t testing.TB, n int) *Network {
	t.Helper()
	var missing string
	if _, err := exec.LookPath("ip"); err != nil {
		missing = "iproute2's ip: " + err.Error()
	} else if os.Geteuid() != 0 {
		missing = "root, for network namespaces"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("a private network is required under CI (CI=true) and needs %s", missing)
		}
		t.Skipf("a private network needs %s", missing)
	}
	id := make([]byte, 3)
	var nw *Network
	for range 20 {
		rand.Read(id)
		prefix := fmt.Sprintf("10.201.%d.", 1+int(id[2])%254)
		out, err := exec.Command("ip", "-4", "route", "show", "to", "match", prefix+"1").Output()
		if err != nil {
			t.Fatalf("ip route show: %v", err)
		}
		if strings.Contains(string(out), "10.201.") {
			continue // someone else's (a parallel test's) network
		}
		nw = &Network{Gateway: prefix + "1", bridge: fmt.Sprintf("scb%x", id[:2]), prefix: prefix}
		break
	}
	if nw == nil {
		t.Fatal("no free /24 in 10.201.0.0/16 after 20 tries")
	}
	t.Cleanup(func() { ip("link", "del", nw.bridge) })
	for _, args := range [][]string{
		{"link", "add", "name", nw.bridge, "type", "bridge"},
		{"addr", "add", nw.Gateway + "/24", "dev", nw.bridge},
		{"link", "set", nw.bridge, "up"},
	} {
		if err := ip(args...); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		h := &Host{IP: fmt.Sprintf("%s%d", nw.prefix, 10+i), ns: fmt.Sprintf("%s-%d", nw.bridge, i), link: fmt.Sprintf("%sh%d", nw.bridge, i)}
		peer := fmt.Sprintf("%sn%d", nw.bridge, i)
		t.Cleanup(func() { ip("netns", "del", h.ns) })
		for _, args := range [][]string{
			{"netns", "add", h.ns},
			{"link", "add", h.link, "type", "veth", "peer", "name", peer},
			{"link", "set", peer, "netns", h.ns},
			{"link", "set", h.link, "master", nw.bridge},
			{"link", "set", h.link, "up"},
			{"-n", h.ns, "addr", "add", h.IP + "/24", "dev", peer},
			{"-n", h.ns, "link", "set", peer, "up"},
			{"-n", h.ns, "link", "set", "lo", "up"},
		} {
			if err := ip(args...); err != nil {
				t.Fatal(err)
			}
		}
		nw.hosts = append(nw.hosts, h)
	}
	return nw
}

// Hosts are the network's hosts, in order (addresses .10, .11, …).
func (nw *Network) Hosts() []*Host { return nw.hosts }

// Run is the command line that runs bin with args inside the host's
// network namespace.
func (h *Host) Run(bin string, args ...string) (string, []string) {
	return "ip", append([]string{"netns", "exec", h.ns, bin}, args...)
}

// Cut takes the host off the network: nothing reaches it, nothing it
// sends arrives, and connections to and from it are not reset but go
// silent, as in a partition.
func (h *Host) Cut() error { return ip("link", "set", h.link, "down") }

// Heal puts a cut host back on the network.
func (h *Host) Heal() error { return ip("link", "set", h.link, "up") }
