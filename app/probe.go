package app

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/stepcollect/stepcollect/internal/config"
)

// probeFlags are the flags whose address -probe asks, in order: the api's
// -listen (it may also have a -metrics-listen, which serves no /readyz),
// the worker's -metrics-listen.
var probeFlags = []string{"listen", "metrics-listen"}

// probeTimeout bounds the whole probe: /readyz bounds its own checks to
// 2 s, and a container health check's timeout should be longer than this.
const probeTimeout = 4 * time.Second

// probe is -probe: GET /readyz on this binary's own listen address (the
// flag's value, from the command line or the environment, as the running
// service read it) and exit 0 on a 200, 1 otherwise. It is the container
// health check on an image without a shell or curl. What /readyz said goes
// to stdout (200) or stderr, where docker inspect shows it.
func probe(flags *config.Set, stdout, stderr io.Writer) int {
	addr := ""
	for _, name := range probeFlags {
		if v, ok := flags.Lookup(name); ok {
			addr = v
			break
		}
	}
	u, err := probeURL(addr)
	if err != nil {
		fmt.Fprintln(stderr, "probe:", err)
		return 1
	}
	client := &http.Client{Timeout: probeTimeout}
	resp, err := client.Get(u)
	if err != nil {
		fmt.Fprintln(stderr, "probe:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	line := u + ": " + resp.Status + ": " + strings.Join(strings.Fields(string(body)), " ")
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(stderr, "probe:", line)
		return 1
	}
	fmt.Fprintln(stdout, "probe:", line)
	return 0
}

// probeURL is the readiness URL of a listen address: a wildcard host
// (0.0.0.0, ::, none) is asked on loopback.
func probeURL(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("no address to probe (-%s): %v", strings.Join(probeFlags, " or -"), err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}
