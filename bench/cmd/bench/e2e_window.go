package main

import (
	"database/sql"
	"strconv"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// awaitZero calls count until it returns 0, and returns when it first did;
// left is the last count (0 when it got there, -1 when count never
// answered). It gives up after stall without the count changing, or after
// limit.
func awaitZero(count func() (int, error), stall, limit time.Duration) (at time.Time, left int) {
	start := time.Now()
	lastChange, prev := start, -1
	for {
		k, err := count()
		at = time.Now()
		if err == nil && k == 0 {
			return at, 0
		}
		if err == nil && k != prev {
			lastChange, prev = at, k
		}
		if at.Sub(lastChange) > stall || at.Sub(start) > limit {
			return at, prev
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// window is the span the CPU times and statement counts are taken over.
type window struct {
	admin *sql.DB // of the server the counters are read on
	pids  map[string]int
	cpu0  map[string]float64
	st0   map[string]float64
	t0    time.Time
}

// openWindow takes the first snapshot and starts the clock.
func (r *runner) openWindow(admin *sql.DB, pids map[string]int) (*window, error) {
	st, err := globalStatus(admin)
	if err != nil {
		return nil, err
	}
	w := &window{admin: admin, pids: pids, st0: st, cpu0: cpuTimes(pids)}
	w.t0 = time.Now()
	return w, nil
}

// close takes the second snapshot into run. probes are the statements the
// bench ran on the server meanwhile (the second SHOW is one more): each is
// one Com_select and one Questions.
func (w *window) close(run *e2eRun, probes int) error {
	cpu := cpuTimes(w.pids)
	run.WindowMS = fanout.MS(time.Since(w.t0))
	st, err := globalStatus(w.admin)
	if err != nil {
		return err
	}
	run.CPU = map[string]float64{}
	for name := range w.pids {
		run.CPU[name] = cpu[name] - w.cpu0[name]
	}
	run.Statements = map[string]float64{}
	for k, v := range st {
		if d := v - w.st0[k]; d != 0 {
			run.Statements[k] = d
		}
	}
	run.BenchStatements = probes + 1
	run.Statements["Com_select"] -= float64(probes)
	run.Statements["Questions"] -= float64(probes + 1)
	return nil
}

// globalStatus is the server's statement counters: every Com_*, Questions
// and Connections.
func globalStatus(admin *sql.DB) (map[string]float64, error) {
	rows, err := admin.Query(`SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Com\_%' OR Variable_name IN ('Questions', 'Connections')`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, err
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out, rows.Err()
}
