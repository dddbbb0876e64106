package app

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/config"
)

// readyz is a stand-in /readyz that answers 200 or 503 as told.
func readyz(t *testing.T) (addr string, ready *atomic.Bool) {
	t.Helper()
	ready = new(atomic.Bool)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" || r.Method != http.MethodGet {
			http.NotFound(w, r)
			return
		}
		if !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte("mysql: dial tcp: connection refused\nredis: ok\n"))
			return
		}
		w.Write([]byte("mysql: ok\nredis: ok\n"))
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String(), ready
}

// -probe asks /readyz on the address the binary itself would listen on
// (the api's -listen, the worker's -metrics-listen, from a flag or the
// environment; a wildcard host on loopback) and exits 0 only on a 200.
func TestProbeAsksTheBinarysOwnReadyz(t *testing.T) {
	addr, ready := readyz(t)
	_, port, _ := net.SplitHostPort(addr)
	parsers := map[string]func() (*config.Set, error){
		"api -listen": func() (*config.Set, error) {
			_, s, err := ParseAPIConfig([]string{"-probe", "-listen", addr}, func(string) string { return "" })
			return s, err
		},
		"api STEPCOLLECT_LISTEN=0.0.0.0": func() (*config.Set, error) {
			_, s, err := ParseAPIConfig([]string{"-probe"}, func(k string) string {
				return map[string]string{"STEPCOLLECT_LISTEN": "0.0.0.0:" + port}[k]
			})
			return s, err
		},
		"worker -metrics-listen": func() (*config.Set, error) {
			_, s, err := ParseWorkerConfig([]string{"-probe", "-metrics-listen", addr}, func(string) string { return "" })
			return s, err
		},
		"worker STEPCOLLECT_METRICS_LISTEN=[::]": func() (*config.Set, error) {
			_, s, err := ParseWorkerConfig([]string{"-probe"}, func(k string) string {
				return map[string]string{"STEPCOLLECT_METRICS_LISTEN": "[::]:" + port}[k]
			})
			return s, err
		},
	}
	for name, parse := range parsers {
		t.Run(name, func(t *testing.T) {
			flags, err := parse()
			if err != nil {
				t.Fatal(err)
			}
			var stdout, stderr strings.Builder
			ready.Store(true)
			if code := probe(flags, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "200 OK: mysql: ok redis: ok") {
				t.Errorf("ready: exit %d, stdout %q, stderr %q; want 0 and what /readyz said", code, stdout.String(), stderr.String())
			}
			stdout.Reset()
			ready.Store(false)
			if code := probe(flags, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "503 Service Unavailable: mysql: dial tcp") {
				t.Errorf("not ready: exit %d, stderr %q; want 1 and the failing part named", code, stderr.String())
			}
		})
	}

	// a wildcard listen address is asked on loopback (Linux would connect
	// to 0.0.0.0 as to itself, other systems do not: the URL says which)
	for addr, want := range map[string]string{
		"0.0.0.0:9100": "http://127.0.0.1:9100/readyz", "[::]:9101": "http://127.0.0.1:9101/readyz", ":9100": "http://127.0.0.1:9100/readyz",
		"10.1.2.3:9100": "http://10.1.2.3:9100/readyz", "[::1]:9101": "http://[::1]:9101/readyz", "localhost:9100": "http://localhost:9100/readyz",
	} {
		if got, err := probeURL(addr); err != nil || got != want {
			t.Errorf("probeURL(%q) = %q, %v; want %s", addr, got, err, want)
		}
	}
	if _, err := probeURL("9100"); err == nil {
		t.Error("probeURL(9100): no error for an address without a port")
	}

	// nothing listening
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	_, flags, err := ParseWorkerConfig([]string{"-probe", "-metrics-listen", closed}, func(string) string { return "" })
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr strings.Builder
	if code := probe(flags, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "connection refused") {
		t.Errorf("nothing listening: exit %d, stderr %q", code, stderr.String())
	}
}

// run handles -probe before it starts anything: no service, no pool, no
// listener of its own (the probe runs beside the service it checks).
func TestRunProbesWithoutStartingTheService(t *testing.T) {
	addr, ready := readyz(t)
	ready.Store(true)
	args := os.Args
	t.Cleanup(func() { os.Args = args })
	start := func(context.Context, APIConfig, zerolog.Logger) (Service, error) {
		t.Error("run started the service for -probe")
		return nil, context.Canceled
	}
	logs := func(c APIConfig) (string, string) { return c.LogLevel, c.LogFormat }

	os.Args = []string{"api", "-probe", "-listen", addr}
	if code := run("api", ParseAPIConfig, logs, start); code != 0 {
		t.Errorf("-probe against a ready api: exit %d, want 0", code)
	}
	ready.Store(false)
	if code := run("api", ParseAPIConfig, logs, start); code != 1 {
		t.Errorf("-probe against an api that is not ready: exit %d, want 1", code)
	}
	// -version and -h start nothing either, and exit 0
	for _, a := range [][]string{{"api", "-version"}, {"api", "-h"}} {
		os.Args = a
		if code := run("api", ParseAPIConfig, logs, start); code != 0 {
			t.Errorf("%v: exit %d, want 0", a, code)
		}
	}
}
