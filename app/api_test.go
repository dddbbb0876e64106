package app_test

import (
	"context"
	"net/http"
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

// With -metrics-listen, /metrics is served on that listener alone: the
// webhook's listener answers 404 for it. Without, it stays on -listen.
func TestMetricsListenServesMetricsThereAndNotOnTheMainListener(t *testing.T) {
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	for _, separate := range []bool{true, false} {
		args := []string{"-listen", "127.0.0.1:0", "-mysql-dsn", db.DSN, "-redis-url", rs.URL, "-api-key", "k"}
		if separate {
			args = append(args, "-metrics-listen", "127.0.0.1:0")
		}
		cfg, _, err := app.ParseAPIConfig(args, func(string) string { return "" })
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		a, err := app.NewAPI(ctx, cfg, zerolog.Nop())
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); a.Run(ctx) }()
		main := "http://" + a.Addr()
		if separate {
			if a.MetricsAddr() == "" {
				t.Fatal("-metrics-listen set, but the api has no metrics listener")
			}
			if got := get(t, "http://"+a.MetricsAddr()+"/metrics"); got != http.StatusOK {
				t.Errorf("GET /metrics on -metrics-listen: %d, want 200", got)
			}
			if got := get(t, main+"/metrics"); got != http.StatusNotFound {
				t.Errorf("GET /metrics on -listen with -metrics-listen set: %d, want 404", got)
			}
		} else if got := get(t, main+"/metrics"); got != http.StatusOK {
			t.Errorf("GET /metrics on -listen without -metrics-listen: %d, want 200", got)
		}
		cancel()
		wg.Wait()
	}
}
