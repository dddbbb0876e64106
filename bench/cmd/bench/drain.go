package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// drainResult is one worker-throughput measurement: a backlog the api
// committed with no worker running, drained by workers worker processes.
type drainResult struct {
	Mode      string         `json:"mode"` // "drain"
	Server    string         `json:"server"`
	Workers   int            `json:"workers"`
	N         int            `json:"n"`
	Completed int            `json:"completed"`
	Errors    map[string]int `json:"errors"`
	// The api, committing the N results with no worker running.
	APIWallMS float64 `json:"api_wall_ms"`
	APIPerS   float64 `json:"api_per_s"`
	// The backlog when the workers started: collect tasks on the queue,
	// events in the outbox, steps in the table.
	QueueDepth int `json:"queue_depth"`
	OutboxRows int `json:"outbox_rows"`
	StepRows   int `json:"step_rows"`
	// From starting the processes to every one answering /readyz; from
	// there to the steps table first seen empty and to the last of the N
	// distinct step.completed events at the receiver (zero: not within the
	// wait).
	StartMS     float64 `json:"start_ms"`
	CollectedMS float64 `json:"collected_ms"`
	DeliveredMS float64 `json:"delivered_ms"`
	// The rates with every worker running, until 90% of the backlog is
	// done: from all ready (or 10% done, if later) to 90% done, steps from
	// the steps table's count (every 20 ms, interpolated), events from
	// their arrival times. Processes start tens to hundreds of ms apart on
	// a busy machine, and the first to start drains alone meanwhile: that
	// part (DoneBeforeReady) is not in the rate. Zero: the backlog was too
	// small to leave a window of 100 ms with all of them running.
	CollectedPerS        float64 `json:"collected_per_s"`
	DeliveredPerS        float64 `json:"delivered_per_s"`
	CollectedBeforeReady int     `json:"collected_before_ready"`
	DeliveredBeforeReady int     `json:"delivered_before_ready"`
	// What the workers counted and the receiver saw, and what was left.
	StepsCollected int             `json:"steps_collected"`
	Deliveries     int             `json:"deliveries_ok"`
	EventsReceived int             `json:"events_received"`
	EventsDistinct int             `json:"events_distinct"`
	Stranded       fanout.Stranded `json:"stranded"`
	OutboxLeft     int             `json:"outbox_left"`
}

// drain measures how fast workers worker processes drain a backlog: the
// api commits n results of a step each with no worker running (its
// hand-off queues the collect tasks, the events wait in the outbox), then
// the workers start together and the bench times the steps table to
// empty and the receiver to hold all n events.
func (r *runner) drain(cfg serverConfig, n, workers int) (*drainResult, error) {
	r.step++
	progress("[%d/%d] %-28s %-8s N=%-5d %d worker(s) draining a backlog …", r.step, max(r.total, r.step), implService, cfg.Name, n, workers)
	e, err := r.startEnv(cfg, 0, min(cfg.Pool, n), "")
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.createSteps(0, n, true, 32); err != nil {
		return nil, err
	}
	b := e.burst(n, true, nil)
	res := &drainResult{Mode: "drain", Server: cfg.Name, Workers: workers, N: n, Completed: b.completed, Errors: b.errors,
		APIWallMS: fanout.MS(b.wall), APIPerS: float64(b.completed) / b.wall.Seconds()}

	// the api's hand-off enqueues within milliseconds of the last commit:
	// wait until the queue it fills stops growing
	prev := -1
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		s, err := scrapeAll(e.apiURL)
		if err != nil {
			return nil, err
		}
		if d := int(s[seriesQueueDepth]); d == prev {
			break
		} else {
			prev = d
		}
	}
	res.QueueDepth = prev
	res.OutboxRows = e.outboxPending()
	if err := e.db.QueryRow(`SELECT COUNT(*) FROM steps`).Scan(&res.StepRows); err != nil {
		fmt.Fprintf(logOut, " (counting steps: %v)", err)
	}
	fmt.Fprintf(logOut, " api %.0f results/s; backlog %d steps, %d collect tasks, %d events …", res.APIPerS, res.StepRows, res.QueueDepth, res.OutboxRows)

	// the steps table's count, every 20 ms from the launch until empty
	type point struct {
		t    time.Time
		left int
	}
	var series []point
	stop, polled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(polled)
		for {
			var left int
			if err := e.probe.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM steps`).Scan(&left); err == nil {
				series = append(series, point{time.Now(), left})
				if left == 0 {
					return
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	launched := time.Now()
	ready, err := e.startWorkers(workers)
	if err != nil {
		close(stop)
		<-polled
		return nil, err
	}
	res.StartMS = fanout.MS(ready.Sub(launched))
	select {
	case <-polled:
	case <-time.After(5 * time.Minute):
		close(stop)
		<-polled
	}
	// when the count crossed left, and what was left at t, interpolated
	// between looks
	crossed := func(left float64) (time.Time, bool) {
		for i, p := range series {
			if float64(p.left) > left {
				continue
			}
			if i == 0 {
				return p.t, true
			}
			a := series[i-1]
			f := (float64(a.left) - left) / float64(a.left-p.left)
			return a.t.Add(time.Duration(f * float64(p.t.Sub(a.t)))), true
		}
		return time.Time{}, false
	}
	leftAt := func(t time.Time) float64 {
		for i, p := range series {
			if p.t.Before(t) {
				continue
			}
			if i == 0 {
				return float64(p.left)
			}
			a := series[i-1]
			f := float64(t.Sub(a.t)) / float64(p.t.Sub(a.t))
			return float64(a.left) - f*float64(a.left-p.left)
		}
		return float64(series[len(series)-1].left)
	}
	const minWindow = 100 * time.Millisecond
	if len(series) > 0 && series[len(series)-1].left == 0 {
		last := series[len(series)-1]
		res.CollectedMS = fanout.MS(last.t.Sub(ready))
		res.CollectedBeforeReady = res.StepRows - int(leftAt(ready))
		from, _ := crossed(0.9 * float64(res.StepRows))
		to, _ := crossed(0.1 * float64(res.StepRows))
		if from.Before(ready) {
			from = ready
		}
		if to.Sub(from) >= minWindow {
			res.CollectedPerS = (leftAt(from) - 0.1*float64(res.StepRows)) / to.Sub(from).Seconds()
		}
	}
	if e.recv.AwaitCompletions(b.completed, 30*time.Second, 5*time.Minute) {
		arr := e.recv.CompletionArrivals()
		res.DeliveredMS = fanout.MS(arr[len(arr)-1].Sub(ready))
		res.DeliveredBeforeReady, _ = slices.BinarySearchFunc(arr, ready, func(a, t time.Time) int { return a.Compare(t) })
		from, to := arr[len(arr)/10], arr[len(arr)*9/10]
		if from.Before(ready) {
			from = ready
		}
		if to.Sub(from) >= minWindow {
			in := 0
			for _, a := range arr {
				if a.After(from) && !a.After(to) {
					in++
				}
			}
			res.DeliveredPerS = float64(in) / to.Sub(from).Seconds()
		}
	}
	res.EventsReceived, res.EventsDistinct, _ = e.recv.Completions()
	if res.OutboxLeft, res.Stranded, err = e.leftovers(); err != nil {
		return nil, err
	}
	s, err := scrapeAll(e.metrics...)
	if err != nil {
		return nil, err
	}
	res.StepsCollected, res.Deliveries = int(s[seriesCollected]), int(s.delivered())
	fmt.Fprintf(logOut, " ready after %s (%d steps, %d events done by then); collected %.0f steps/s (all in %s), delivered %.0f events/s (all in %s), %d/%d events\n",
		dur(res.StartMS), res.CollectedBeforeReady, res.DeliveredBeforeReady, res.CollectedPerS, drainString(res.CollectedMS),
		res.DeliveredPerS, drainString(res.DeliveredMS), res.EventsReceived, res.EventsDistinct)
	return res, nil
}
