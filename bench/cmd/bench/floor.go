package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// floor measures the least any design that commits each result durably can
// cost: N concurrent single-row autocommit UPDATEs, each on its own row, on
// the same server, setting and pool.
func (r *runner) floor(cfg serverConfig, n int, control bool) (*fanout.Result, error) {
	r.announce(implFloor, cfg, n, control, fanout.ModeFanOut)
	admin, server := r.serverOf(cfg)
	dsn, drop, err := freshDatabase(admin, server, cfg.params)
	if err != nil {
		return nil, err
	}
	defer drop()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(cfg.Pool)
	db.SetMaxIdleConns(cfg.Pool)
	ctx := context.Background()
	if _, err := db.Exec(`CREATE TABLE floor_rows (id INT NOT NULL PRIMARY KEY, v BIGINT NOT NULL DEFAULT 0)`); err != nil {
		return nil, err
	}
	for start := 0; start < n; start += 1000 {
		end := min(n, start+1000)
		vals := make([]string, 0, end-start)
		for i := start; i < end; i++ {
			vals = append(vals, fmt.Sprintf("(%d)", i))
		}
		if _, err := db.Exec(`INSERT INTO floor_rows (id) VALUES ` + strings.Join(vals, ",")); err != nil {
			return nil, err
		}
	}
	if err := fanout.Warm(ctx, db, min(cfg.Pool, n)); err != nil {
		return nil, err
	}
	r.settle() // the previous row's purge is not this row's
	res := &fanout.Result{Config: fanout.Config{Impl: implFloor, Mode: fanout.ModeFanOut, N: n, Control: control, Pool: cfg.Pool}, Errors: map[string]int{}, Server: cfg.Name}
	lat := make([]time.Duration, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			t0 := time.Now()
			_, err := db.ExecContext(ctx, `UPDATE floor_rows SET v = v + 1 WHERE id = ?`, i)
			lat[i] = time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Errors[fanout.ErrClass(err)]++
			} else {
				res.Completed++
			}
		}()
	}
	// the floor's CPU, as the service rows': the server's (when the bench
	// can see it) and the load generator's, during the burst alone
	pids := map[string]int{"load generator": os.Getpid()}
	if r.serverPID > 0 && cfg.on == nil {
		pids["mysqld"] = r.serverPID
	}
	before := cpuTimes(pids)
	start := time.Now()
	close(release)
	wg.Wait()
	res.WallMS = fanout.MS(time.Since(start))
	after := cpuTimes(pids)
	res.CPU = map[string]float64{}
	for name := range pids {
		res.CPU[name] = after[name] - before[name]
	}
	res.P50MS, res.P99MS = fanout.Quantiles(lat)
	done(res)
	return res, nil
}
