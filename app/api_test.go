package app_test

import (
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

func get(t *testing.T, url string) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// With -metrics-listen (or STEPCOLLECT_API_METRICS_LISTEN), /metrics is
// served on that listener alone: the webhook's listener answers 404 for
// it. Without, it stays on -listen, and the worker's
// STEPCOLLECT_METRICS_LISTEN in the api's environment (make run, an env
// file shared by both) does not move it: it says so once at start.
func TestMetricsListenServesMetricsThereAndNotOnTheMainListener(t *testing.T) {
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	worker, err := net.Listen("tcp", "127.0.0.1:0") // the worker's metrics port, taken
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()
	for _, c := range []struct {
		name     string
		separate bool
		env      map[string]string
	}{
		{"-metrics-listen", true, nil},
		{"STEPCOLLECT_API_METRICS_LISTEN", true, map[string]string{"STEPCOLLECT_API_METRICS_LISTEN": "127.0.0.1:0"}},
		{"neither", false, nil},
		{"the worker's STEPCOLLECT_METRICS_LISTEN", false, map[string]string{"STEPCOLLECT_METRICS_LISTEN": worker.Addr().String()}},
	} {
		args := []string{"-listen", "127.0.0.1:0", "-mysql-dsn", db.DSN, "-redis-url", rs.URL, "-api-key", "k"}
		if c.name == "-metrics-listen" {
			args = append(args, "-metrics-listen", "127.0.0.1:0")
		}
		cfg, _, err := app.ParseAPIConfig(args, func(k string) string { return c.env[k] })
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		logs := &testkit.LogBuffer{} // the handlers log to it too
		a, err := app.NewAPI(ctx, cfg, zerolog.New(logs))
		if err != nil {
			cancel()
			t.Fatalf("%s: %v", c.name, err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(ctx) }()
		main := "http://" + a.Addr()
		if c.separate {
			if a.MetricsAddr() == "" {
				t.Fatalf("%s set, but the api has no metrics listener", c.name)
			}
			if got := get(t, "http://"+a.MetricsAddr()+"/metrics"); got != http.StatusOK {
				t.Errorf("%s: GET /metrics on the metrics listener: %d, want 200", c.name, got)
			}
			if got := get(t, main+"/metrics"); got != http.StatusNotFound {
				t.Errorf("%s: GET /metrics on -listen with a metrics listener: %d, want 404", c.name, got)
			}
		} else {
			if a.MetricsAddr() != "" {
				t.Errorf("%s: the api listens for /metrics on %s, want it on -listen alone", c.name, a.MetricsAddr())
			}
			if got := get(t, main+"/metrics"); got != http.StatusOK {
				t.Errorf("%s: GET /metrics on -listen without -metrics-listen: %d, want 200", c.name, got)
			}
		}
		said := strings.Contains(logs.String(), "STEPCOLLECT_METRICS_LISTEN is the worker's")
		if want := c.env["STEPCOLLECT_METRICS_LISTEN"] != ""; said != want {
			t.Errorf("%s: the api's note that STEPCOLLECT_METRICS_LISTEN is the worker's logged %v, want %v:\n%s", c.name, said, want, logs.String())
		}
		cancel()
		wg.Wait()
	}
}
