package app_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

func TestRePushFlagsTakeTheEnvironmentAndDefaultToNanoCMDs(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	cfg, _, err := app.ParseWorkerConfig(nil, env(nil))
	if err != nil || cfg.PushURL != "" || cfg.PushAPIKey != "" || cfg.RePushInterval != 24*time.Hour {
		t.Errorf("defaults: %q %q %v %v, want no URL, no key, 24h", cfg.PushURL, cfg.PushAPIKey, cfg.RePushInterval, err)
	}
	cfg, _, err = app.ParseWorkerConfig([]string{"-repush-interval", "0"}, env(map[string]string{
		"STEPCOLLECT_PUSH_URL": "https://nanomdm.example/v1/push/", "STEPCOLLECT_PUSH_API_KEY": "k", "STEPCOLLECT_REPUSH_INTERVAL": "1h",
	}))
	if err != nil || cfg.PushURL != "https://nanomdm.example/v1/push/" || cfg.PushAPIKey != "k" || cfg.RePushInterval != 0 {
		t.Errorf("from the environment, interval on the command line: %q %q %v %v", cfg.PushURL, cfg.PushAPIKey, cfg.RePushInterval, err)
	}
}

func TestBadRePushFlagsAreRefusedInOneLineNamingTheFlag(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-push-url", "ftp://nanomdm.example/v1/push/"}, nil, "-push-url: "},
		{[]string{"-push-url", "nanomdm:9000/v1/push/"}, nil, "-push-url: "},
		{[]string{"-push-url", "http://nanomdm.example/v1/push/?x=1"}, nil, "-push-url: "},
		{[]string{"-repush-interval", "-1s"}, nil, "-repush-interval: -1s is negative"},
		{[]string{"-repush-interval", "daily"}, nil, "-repush-interval"},
		{nil, map[string]string{"STEPCOLLECT_REPUSH_INTERVAL": "daily"}, `-repush-interval: STEPCOLLECT_REPUSH_INTERVAL="daily"`},
		{[]string{"-push-url", "ftp://nano:S3cretPw@nanomdm.example/v1/push/"}, nil, "-push-url: "},
		{[]string{"-push-url", "http://nanomdm.example/v1/push/"}, nil, "-push-api-key: required with -push-url"},
	} {
		_, _, err := app.ParseWorkerConfig(c.args, func(k string) string { return c.env[k] })
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") || strings.Contains(err.Error(), "S3cretPw") {
			t.Errorf("%v %v: %v, want one line containing %q and no password", c.args, c.env, err, c.want)
		}
	}
}

// -h shows whether the push key is set, never the key.
func TestHelpShowsNoPushAPIKey(t *testing.T) {
	_, s, err := app.ParseWorkerConfig([]string{"-h"}, func(k string) string {
		if k == "STEPCOLLECT_PUSH_API_KEY" {
			return "push-s3cret"
		}
		return ""
	})
	if err == nil {
		t.Fatal("-h: no error, want the help request")
	}
	var out bytes.Buffer
	s.Usage(&out)
	if strings.Contains(out.String(), "push-s3cret") {
		t.Errorf("-h shows the push key:\n%s", out.String())
	}
	for _, want := range []string{"-push-url", "-repush-interval", "(env STEPCOLLECT_PUSH_API_KEY) (set)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-h lacks %q:\n%s", want, out.String())
		}
	}
}

// A worker given -push-url re-pushes, in its schedule runs, the enrollments
// whose command has gone unanswered for -repush-interval, through NanoMDM's
// push API with its key, and counts them on /metrics.
func TestTheWorkerRePushesUnansweredEnrollmentsThroughThePushAPI(t *testing.T) {
	b := setupWorker(t)
	var mu sync.Mutex
	pushed := map[string]int{}
	var bad []string
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, key, ok := r.BasicAuth()
		rest, isPush := strings.CutPrefix(r.URL.Path, "/v1/push/")
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodGet || !ok || user != "nanomdm" || key != "push-key" || !isPush {
			bad = append(bad, fmt.Sprintf("%s %s as %q:%q", r.Method, r.URL.Path, user, key))
		}
		for _, id := range strings.Split(rest, ",") {
			pushed[id]++
		}
	}))
	defer api.Close()
	old := testkit.FanOut("old", 70, 1)
	if err := b.results.StoreStep(t.Context(), old, time.Now().Add(-25*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := b.results.StoreStep(t.Context(), testkit.FanOut("recent", 5, 1), time.Now()); err != nil {
		t.Fatal(err)
	}

	cfg := app.WorkerConfig{
		MySQLDSN: b.db.DSN, RedisURL: b.redis.URL, Migrate: true, MetricsListen: "127.0.0.1:0", Concurrency: 4,
		ScheduleInterval: time.Second, ShutdownTimeout: 2 * time.Second, MySQLPool: stepmysql.Pool{MaxConns: 16},
		PushURL: api.URL + "/v1/push", PushAPIKey: "push-key", RePushInterval: 24 * time.Hour,
	}
	ctx, cancel := context.WithCancel(context.Background())
	w, err := app.NewWorker(ctx, cfg, zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// counted once each answer is read, so the count settles after the push
	metricsURL := "http://" + w.MetricsAddr() + "/metrics"
	testkit.WaitUntil(t, 15*time.Second, "stepcollect_repushes_total{outcome=\"ok\"} at 70", func() (bool, any) {
		fams, err := scrape.Families(metricsURL)
		if err != nil {
			return false, err
		}
		got := scrape.Value(fams, "stepcollect_repushes_total", "outcome", "ok")
		return got >= 70, got
	})
	mu.Lock()
	defer mu.Unlock()
	for _, id := range old.IDs {
		if pushed[id] != 1 {
			t.Errorf("%s pushed %d times, want once", id, pushed[id])
		}
	}
	if len(pushed) != 70 || len(bad) > 0 {
		t.Errorf("%d enrollments pushed, want the 70 old ones; requests not in NanoMDM's shape: %v", len(pushed), bad)
	}
}

// -max-delivery-inflight: 256 by default, from the environment, at least 1.
func TestMaxDeliveryInflightFlag(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	if cfg, _, err := app.ParseWorkerConfig(nil, env(nil)); err != nil || cfg.MaxDeliveryInflight != 256 {
		t.Errorf("default: %d %v, want 256", cfg.MaxDeliveryInflight, err)
	}
	if cfg, _, err := app.ParseWorkerConfig(nil, env(map[string]string{"STEPCOLLECT_MAX_DELIVERY_INFLIGHT": "8"})); err != nil || cfg.MaxDeliveryInflight != 8 {
		t.Errorf("from the environment: %d %v, want 8", cfg.MaxDeliveryInflight, err)
	}
	for _, v := range []string{"0", "-3", "many"} {
		_, _, err := app.ParseWorkerConfig([]string{"-max-delivery-inflight", v}, env(nil))
		if err == nil || !strings.Contains(err.Error(), "-max-delivery-inflight") || strings.Contains(err.Error(), "\n") {
			t.Errorf("-max-delivery-inflight %s: %v, want one line naming the flag", v, err)
		}
	}
}
