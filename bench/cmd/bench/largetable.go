package main

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/metrics"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// The large table: 10,000 steps of 100 enrollments each, one command, so
// 1,000,000 id_commands rows, every enrollment holding one: the shape of a
// fleet with many steps outstanding.
const (
	largeSteps        = 10000
	largePerStep      = 100
	largeCancels      = 20
	largeUnreferenced = 100
)

type largeTable struct {
	Rows         int
	LoadMS       float64
	Cancel       []*fanout.Result
	SweepRuns    []float64 // ms per full sweep
	SweepSteps   int
	Unreferenced int
	Collected    int
}

// loadLarge fills a fresh database with the large table.
func loadLarge(dsn string) (time.Duration, error) {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	start := time.Now()
	for s := 0; s < largeSteps; s += 1000 {
		var vals []string
		for i := s; i < min(largeSteps, s+1000); i++ {
			vals = append(vals, fmt.Sprintf("(%d, 'io.stepcollect.bench.bulk', 'bulk-%d', 'bulk')", i+1, i))
		}
		if _, err := db.Exec(`INSERT INTO steps (id, workflow_name, instance_id, step_name) VALUES ` + strings.Join(vals, ",")); err != nil {
			return 0, err
		}
	}
	errc := make(chan error, largeSteps)
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	const stepsPerInsert = 50 // 5000 rows a statement
	for s := 0; s < largeSteps; s += stepsPerInsert {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			var b strings.Builder
			b.WriteString(`INSERT INTO id_commands (enrollment_id, command_uuid, step_id, request_type, last_push) VALUES `)
			first := true
			for st := s; st < min(largeSteps, s+stepsPerInsert); st++ {
				for e := range largePerStep {
					if !first {
						b.WriteByte(',')
					}
					first = false
					fmt.Fprintf(&b, "('BULK-%05d-%03d', 'BULK-UUID-%05d', %d, 'DeviceInformation', NOW())", st, e, st, st+1)
				}
			}
			if _, err := db.Exec(b.String()); err != nil {
				errc <- err
			}
		}()
	}
	wg.Wait()
	close(errc)
	if err := <-errc; err != nil {
		return 0, err
	}
	db.Exec(`ANALYZE TABLE steps, id_commands`)
	return time.Since(start), nil
}

// largeTable measures CancelSteps for each implementation, and stepcollect's
// sweeper, against the large table.
func (r *runner) largeTable(want func(string) bool) *largeTable {
	lt := &largeTable{Rows: largeSteps * largePerStep, SweepSteps: largeSteps + largeUnreferenced, Unreferenced: largeUnreferenced}
	cfg := configs[0]
	for _, im := range storageImpls {
		if !want(im.Label) {
			continue
		}
		progress("[large table] %s: loading 1,000,000 id_commands rows …", im.Label)
		dsn, drop, err := freshDatabase(r.admin, r.server, im.params)
		if err != nil {
			die("%v", err)
		}
		took, err := loadLarge(dsn)
		if err != nil {
			drop()
			die("loading the large table: %v", err)
		}
		lt.LoadMS = fanout.MS(took)
		fmt.Fprintf(logOut, " loaded in %v; %d CancelSteps …", took.Round(time.Millisecond), 2*largeCancels)
		res, err := runBinary(r.bin+"/"+im.Binary, im.Label, fanout.ModeCancel, dsn, largeCancels, cfg.Pool, false, 1)
		drop()
		if err != nil {
			die("%v", err)
		}
		res.Server = cfg.Name
		fmt.Fprintf(logOut, " p50 %.1f ms, p99 %.1f ms\n", res.P50MS, res.P99MS)
		lt.Cancel = append(lt.Cancel, res)
		b, _ := jsonLine(res)
		r.raw.Write(b)
	}

	if want("stepcollect storage") {
		progress("[large table] stepcollect sweeper: loading …")
		dsn, drop, err := freshDatabase(r.admin, r.server, map[string]string{"interpolateParams": "true"})
		if err != nil {
			die("%v", err)
		}
		defer drop()
		if _, err := loadLarge(dsn); err != nil {
			die("%v", err)
		}
		db, _ := sql.Open("mysql", dsn)
		defer db.Close()
		for i := range largeUnreferenced {
			db.Exec(`INSERT INTO steps (id, workflow_name, instance_id) VALUES (?, 'io.stepcollect.bench.lost', 'lost')`, largeSteps+1+i)
		}
		store, err := stepmysql.New(stepmysql.WithDB(db))
		if err != nil {
			die("%v", err)
		}
		reg := prometheus.NewRegistry()
		sw := collector.NewSweeper(collector.SweeperConfig{}, store, nil, metrics.NewSweeper(reg), zerolog.Nop())
		for run := range 3 {
			start := time.Now()
			res, err := sw.Sweep(context.Background())
			if err != nil {
				die("sweep: %v", err)
			}
			lt.SweepRuns = append(lt.SweepRuns, fanout.MS(time.Since(start)))
			if run == 0 {
				lt.Collected = res.Collected
			}
		}
		fmt.Fprintf(logOut, " sweeps of %d steps: %.0f / %.0f / %.0f ms, collected %d\n", lt.SweepSteps, lt.SweepRuns[0], lt.SweepRuns[1], lt.SweepRuns[2], lt.Collected)
	}
	return lt
}
