package app_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/internal/testkit"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// What no wait mends stops the process at start with MySQL's own words:
// here a password MySQL refuses.
func TestAPIRefusedByMySQLStopsAtStartNamingWhy(t *testing.T) {
	db := testkit.NewDB(t, nil)
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = "stepcollect_no_such_user", "wrong"
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	began := time.Now()
	_, err = app.NewAPI(ctx, app.APIConfig{MySQLDSN: cfg.FormatDSN(), RedisURL: "redis://127.0.0.1:1", Migrate: true, Listen: "127.0.0.1:0",
		MaxBodyBytes: 1 << 20, MySQLPool: stepmysql.Pool{MaxConns: 4}}, zerolog.Nop())
	if err == nil || !strings.Contains(err.Error(), "Access denied") || strings.Contains(err.Error(), "wrong") {
		t.Fatalf("NewAPI with a refused password: %v, want MySQL's Access denied, the password redacted", err)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("the refusal took %v: it waited as for a server that does not answer", d)
	}
}

// Told to stop while it waits for MySQL, a worker returns at once, saying
// what it was waiting for.
func TestWorkerToldToStopWhileWaitingForMySQLReturns(t *testing.T) {
	addr := testkit.FreeAddr(t) // nothing listens there
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	logs := &testkit.LogBuffer{}
	go func() {
		_, err := app.NewWorker(ctx, app.WorkerConfig{MySQLDSN: "root@tcp(" + addr + ")/nothing", RedisURL: "redis://127.0.0.1:1",
			Migrate: true, MetricsListen: "127.0.0.1:0", Concurrency: 1, ShutdownTimeout: time.Second, MySQLPool: stepmysql.Pool{MaxConns: 4}}, zerolog.New(logs))
		errc <- err
	}()
	testkit.WaitUntil(t, 15*time.Second, "the worker waiting for MySQL (its log)", func() (bool, any) {
		return strings.Contains(logs.String(), "waiting for MySQL before starting"), logs.String()
	})
	cancel()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "stopped while waiting: MySQL does not answer yet") {
			t.Fatalf("NewWorker told to stop while waiting: %v, want it to say it stopped waiting for MySQL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("NewWorker did not return within 10 s of being told to stop")
	}
}
