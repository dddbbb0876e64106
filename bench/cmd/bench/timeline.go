package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// timeline samples a service burst every 50 ms: the webhooks answered so
// far and each process's CPU since the release. It shows where in a burst
// a result costs more (docs/bench/pairs-2026-12-05b: the first second of
// a burst costs more a result than the rest, which is why N=3000 costs
// more a result than N=10000). /proc counts CPU in 10 ms ticks, so a
// 50 ms sample of one process is coarse; sum a few.
type timeline struct {
	names []string
	stop  chan struct{}
	done  chan string
}

func startTimeline(start time.Time, pids map[string]int, before map[string]float64, answered func() int) *timeline {
	t := &timeline{stop: make(chan struct{}), done: make(chan string, 1)}
	for name := range pids {
		t.names = append(t.names, name)
	}
	slices.Sort(t.names)
	go func() {
		var sb strings.Builder
		sb.WriteString("ms\tanswered")
		for _, name := range t.names {
			sb.WriteString("\t" + name + " cpu ms")
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
