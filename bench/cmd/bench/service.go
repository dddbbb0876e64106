package main

import (
	"sync"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

// service measures stepcollect as a service: the real cmd/api taking the
// results over HTTP as NanoMDM's webhook, the real cmd/worker collecting
// from a private Redis (its sweeper off) and delivering step.completed to
// the bench's receiver. Wall time and latencies are the HTTP requests';
// collection lag comes from the worker's own histogram; "collected after"
// and "delivered after" are timed from the last webhook 200.
func (r *runner) service(cfg serverConfig, n int, control bool) (*fanout.Result, error) {
	return r.serviceProfiled(cfg, n, control, "")
}

// serviceProfiled is service, with the api writing a CPU profile to
// profile when it is not empty.
func (r *runner) serviceProfiled(cfg serverConfig, n int, control bool, profile string) (*fanout.Result, error) {
	r.announce(implService, cfg, n, control, fanout.ModeFanOut)
	e, err := r.startEnv(cfg, 1, min(cfg.Pool, n), profile)
	if err != nil {
		return nil, err
	}
	defer e.close()
	if err := e.createSteps(0, n, control, 16); err != nil {
		return nil, err
	}
	serverPID := r.serverPID
	if cfg.on != nil {
		serverPID = 0 // not the server whose CPU the bench can see
	}
	b := e.burst(n, control, e.pids(serverPID))
	res := &fanout.Result{Config: fanout.Config{Impl: implService, Mode: fanout.ModeFanOut, N: n, Control: control, Pool: cfg.Pool},
		Errors: b.errors, Server: cfg.Name, Completed: b.completed, WallMS: fanout.MS(b.wall), CPU: b.cpu}
	res.P50MS, res.P99MS = fanout.Quantiles(b.lat)
	lastOK := b.lastOK

	// collected: the steps table first seen empty; delivered: the last of
	// the N distinct step.completed events at the receiver
	if emptyAt, ok := e.awaitStepsEmpty(2 * time.Minute); ok {
		res.CollectedAfterMS = fanout.MS(emptyAt.Sub(lastOK))
	}
	e.recv.AwaitCompletions(n, 30*time.Second, 2*time.Minute)
	received, distinct, last := e.recv.Completions()
	res.EventsReceived, res.EventsDistinct = received, distinct
	if distinct >= n {
		res.DeliveredAfterMS = fanout.MS(last.Sub(lastOK))
	}
	if res.OutboxLeft, res.Stranded, err = e.leftovers(); err != nil {
		return nil, err
	}
	s, err := scrapeAll(e.metrics...)
	if err != nil {
		return nil, err
	}
	bs := s.lagBuckets(nil)
	res.LagP50MS, res.LagP99MS = quantileMS(bs, 0.5), quantileMS(bs, 0.99)
	res.StepsCollected = int(s[seriesCollected])
	done(res)
	return res, nil
}

// burstResult is what releasing n webhook requests at once found.
type burstResult struct {
	lat       []time.Duration
	lastOK    time.Time // the last 200's arrival (the end of the burst if none)
	completed int
	errors    map[string]int
	wall      time.Duration
	cpu       map[string]float64 // ms of CPU time of each of pids during the burst
}

// burst releases the webhooks of enrollments 0 to n-1 at once, at most
// e.inflight in flight, and times them.
func (e *svcEnv) burst(n int, control bool, pids map[string]int) *burstResult {
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = webhookBody(i, control)
	}
	b := &burstResult{lat: make([]time.Duration, n), errors: map[string]int{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, e.inflight)
	release := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			// from the release, as for every row: waiting for a slot is
			// part of a result's latency, as waiting for a pool connection is
			t0 := time.Now()
			sem <- struct{}{}
			defer func() { <-sem }()
			class := e.webhook(bodies[i])
			at := time.Now()
			b.lat[i] = at.Sub(t0)
			mu.Lock()
			defer mu.Unlock()
			if class != "" {
				b.errors[class]++
			} else {
				b.completed++
				if at.After(b.lastOK) {
					b.lastOK = at
				}
			}
		}()
	}
	before := cpuTimes(pids)
	start := time.Now()
	close(release)
	wg.Wait()
	b.wall = time.Since(start)
	after := cpuTimes(pids)
	b.cpu = map[string]float64{}
	for name := range pids {
		b.cpu[name] = after[name] - before[name]
	}
	if b.lastOK.IsZero() {
		b.lastOK = time.Now()
	}
	return b
}

// cpuTimes reads each process's user+system CPU time, in ms, from /proc.
func cpuTimes(pids map[string]int) map[string]float64 {
	out := map[string]float64{}
	for name, pid := range pids {
		if d, err := testkit.ProcessCPU(pid); err == nil {
			out[name] = float64(d.Milliseconds())
		}
	}
	return out
}
