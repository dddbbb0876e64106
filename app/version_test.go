package app_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// GET /version answers without a key on the api's main listener and on the
// worker's metrics listener, as NanoMDM and NanoCMD answer it.
func TestVersionOnTheAPIAndTheWorker(t *testing.T) {
	b := setupWorker(t)
	workerURL := startWorker(t, b, 0) // its /metrics URL
	cfg, _, err := app.ParseAPIConfig([]string{"-listen", "127.0.0.1:0", "-mysql-dsn", b.db.DSN, "-redis-url", b.redis.URL,
		"-api-key", "k", "-metrics-listen", "127.0.0.1:0"}, func(string) string { return "" })
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
	defer func() { cancel(); wg.Wait() }()
	for _, u := range []string{"http://" + a.Addr() + "/version", strings.TrimSuffix(workerURL, "/metrics") + "/version"} {
		if got := get(t, u); got != http.StatusOK {
			t.Errorf("GET %s: %d, want 200", u, got)
		}
	}
}

func TestDefaultStepTimeoutFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want time.Duration
	}{
		{nil, "", 72 * time.Hour},
		{[]string{"-default-step-timeout", "0"}, "", 0},
		{nil, "24h", 24 * time.Hour},
	} {
		cfg, _, err := app.ParseAPIConfig(c.args, func(k string) string {
			if k == "STEPCOLLECT_DEFAULT_STEP_TIMEOUT" {
				return c.env
			}
			return ""
		})
		if err != nil || cfg.DefaultStepTimeout != c.want {
			t.Errorf("%v %q: %v %v, want %v", c.args, c.env, cfg.DefaultStepTimeout, err, c.want)
		}
	}
	if _, _, err := app.ParseAPIConfig([]string{"-default-step-timeout", "-1h"}, func(string) string { return "" }); err == nil {
		t.Error("-default-step-timeout -1h accepted")
	}
}

func TestMaxActiveResultsFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want int
	}{
		{nil, "", stepmysql.DefaultMaxActiveResults},
		{[]string{"-mysql-max-active-results", "16"}, "", 16},
		{nil, "200", 200},
	} {
		cfg, _, err := app.ParseAPIConfig(c.args, func(k string) string {
			if k == "STEPCOLLECT_MYSQL_MAX_ACTIVE_RESULTS" {
				return c.env
			}
			return ""
		})
		if err != nil || cfg.MySQLMaxActiveResults != c.want {
			t.Errorf("%v %q: %v %v, want %v", c.args, c.env, cfg.MySQLMaxActiveResults, err, c.want)
		}
	}
}
