package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// timeline samples a service burst every 50 ms: the webhooks answered so
// far and each process's CPU since the release. It shows where in a burst
// a result costs more (docs/bench/pairs-2026-12-05b: the first second of
// a burst costs more a result than the rest, which is why N=3000 costs
// more a result than N=10000). /proc counts CPU in 10 ms ticks, so a
// 50 ms sample of one process is coarse; sum a few. Where the server is
// one the bench can query, each sample also has its status counters
// (timelineCounters) since the release: which statements, rows, flushes
// and log writes a window's CPU went to. Reading them is one SHOW GLOBAL
// STATUS a sample, a few hundred microseconds of the server's CPU.
type timeline struct {
	names []string
	stop  chan struct{}
	done  chan string
}

// timelineCounters are the server status counters a timeline follows.
// A counter the server does not have is left out.
var timelineCounters = []string{
	"Questions", "Com_select", "Com_insert", "Com_delete", "Com_update", "Com_call_procedure", "Com_rollback",
	"Innodb_rows_read", "Innodb_rows_inserted", "Innodb_rows_deleted", "Innodb_rows_updated",
	"Innodb_row_lock_waits", "Innodb_buffer_pool_pages_flushed", "Innodb_data_fsyncs", "Innodb_os_log_written",
}

// statusReader reads timelineCounters on conn.
func statusReader(conn *sql.Conn) func() map[string]int64 {
	q := "SHOW GLOBAL STATUS WHERE Variable_name IN ('" + strings.Join(timelineCounters, "','") + "')"
	return func() map[string]int64 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		rows, err := conn.QueryContext(ctx, q)
		if err != nil {
			return nil
		}
		defer rows.Close()
		out := map[string]int64{}
		for rows.Next() {
			var name, value string
			if rows.Scan(&name, &value) == nil {
				if v, err := strconv.ParseInt(value, 10, 64); err == nil {
					out[name] = v
				}
			}
		}
		return out
	}
}

// startTimeline samples until write. status, when not nil, reads the
// server's counters (statusReader); they are read once now, as the base.
func startTimeline(start time.Time, pids map[string]int, before map[string]float64, answered func() int, status func() map[string]int64) *timeline {
	t := &timeline{stop: make(chan struct{}), done: make(chan string, 1)}
	for name := range pids {
		t.names = append(t.names, name)
	}
	slices.Sort(t.names)
	var base map[string]int64
	var counters []string
	if status != nil {
		base = status()
		for _, c := range timelineCounters {
			if _, ok := base[c]; ok {
				counters = append(counters, c)
			}
		}
	}
	go func() {
		var sb strings.Builder
		sb.WriteString("ms\tanswered")
		for _, name := range t.names {
			sb.WriteString("\t" + name + " cpu ms")
		}
		for _, c := range counters {
			sb.WriteString("\t" + c)
		}
		sb.WriteByte('\n')
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				t.done <- sb.String()
				return
			case <-tick.C:
			}
			cpu := cpuTimes(pids)
			fmt.Fprintf(&sb, "%d\t%d", time.Since(start).Milliseconds(), answered())
			for _, name := range t.names {
				fmt.Fprintf(&sb, "\t%.0f", cpu[name]-before[name])
			}
			if len(counters) > 0 {
				now := status()
				for _, c := range counters {
					if v, ok := now[c]; ok {
						fmt.Fprintf(&sb, "\t%d", v-base[c])
					} else {
						sb.WriteString("\t-") // this read failed
					}
				}
			}
			sb.WriteByte('\n')
		}
	}()
	return t
}

// write stops the sampling and appends the burst's samples to path.
func (t *timeline) write(path string, n int) error {
	close(t.stop)
	rows := <-t.done
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "# a service burst of N=%d at %s\n%s", n, time.Now().UTC().Format(time.RFC3339), rows); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
