package main

import (
	"context"
	"fmt"
	"strconv"
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
	// Start warm, as every row's pool does: the api's connections to the
	// database, the worker's to the receiver, both heaps and the server's
	// threads, by a fan-out of the service's own before the measured one.
	if err := e.warmUp(min(n, max(cfg.Pool, warmUpAtLeast))); err != nil {
		return nil, err
	}
	base, err := scrapeAll(e.metrics...)
	if err != nil {
		return nil, err
	}
	posts0, distinct0, _ := e.recv.Completions()
	if err := e.createSteps(0, n, control, 16); err != nil {
		return nil, err
	}
	serverPID := r.serverPID
	if cfg.on != nil {
		serverPID = 0 // not the server whose CPU the bench can see
	}
	// the warm-up's collection and the steps' creation leave purge behind,
	// as the rows before this one do: the burst starts on a quiet server
	r.settle()
	e.timeline = r.timeline
	b := e.burst(n, control, e.pids(serverPID))
	e.timeline = ""
	res := &fanout.Result{Config: fanout.Config{Impl: implService, Mode: fanout.ModeFanOut, N: n, Control: control, Pool: cfg.Pool},
		Errors: b.errors, Server: cfg.Name, Completed: b.completed, WallMS: fanout.MS(b.wall), CPU: b.cpu}
	res.P50MS, res.P99MS = fanout.Quantiles(b.lat)
	lastOK := b.lastOK

	// collected: the steps table first seen empty; delivered: the last of
	// the N distinct step.completed events at the receiver
	if emptyAt, ok := e.awaitStepsEmpty(2 * time.Minute); ok {
		res.CollectedAfterMS = fanout.MS(emptyAt.Sub(lastOK))
	}
	e.recv.AwaitCompletions(distinct0+n, 30*time.Second, 2*time.Minute)
	// what the whole fan-out cost, delivery and collection included: a
	// burst that leaves work for after its last 200 pays for it here
	res.CPUToDone = since(b.cpuStart, cpuTimes(b.pids))
	received, distinct, last := e.recv.Completions()
	received, distinct = received-posts0, distinct-distinct0
	res.EventsReceived, res.EventsDistinct = received, distinct
	if distinct >= n {
		res.DeliveredAfterMS = fanout.MS(last.Sub(lastOK))
	}
	if res.OutboxLeft, res.Stranded, err = e.leftovers(); err != nil {
		return nil, err
	}
	// the worker counts a collection once its whole batch is done, after
	// the DELETE the bench saw: a scrape right after the steps table
	// emptied could miss it (make bench at 2833937: "0 of 1 steps
	// collected" for a step gone 3 ms after the last 200)
	s, err := awaitCollected(e.metrics, base, ifn(control, n, 1), 10*time.Second)
	if err != nil {
		return nil, err
	}
	bs := s.lagBuckets(base)
	res.LagP50MS, res.LagP99MS = quantileMS(bs, 0.5), quantileMS(bs, 0.99)
	res.StepsCollected = int(s[seriesCollected] - base[seriesCollected])
	done(res)
	return res, nil
}

// awaitCollected scrapes the worker's metrics until they count want steps
// collected since base, or for at most limit, and returns the last scrape.
func awaitCollected(metrics []string, base scrape, want int, limit time.Duration) (scrape, error) {
	deadline := time.Now().Add(limit)
	for {
		s, err := scrapeAll(metrics...)
		if err != nil || int(s[seriesCollected]-base[seriesCollected]) >= want || time.Now().After(deadline) {
			return s, err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// burstResult is what releasing n webhook requests at once found.
type burstResult struct {
	lat       []time.Duration
	lastOK    time.Time // the last 200's arrival (the end of the burst if none)
	completed int
	errors    map[string]int
	wall      time.Duration
	cpu       map[string]float64 // ms of CPU time of each of pids during the burst
	pids      map[string]int
	cpuStart  map[string]float64 // each process's CPU time at the release
}

// since is each process's CPU time in now less its time in start.
func since(start, now map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for name, v := range now {
		out[name] = v - start[name]
	}
	return out
}

// warmUpAtLeast is the fewest enrollments the service's warm-up answers
// (where the measured fan-out has as many): the worker opens a connection
// to the receiver for each POST it runs at once, 4 loops of 64.
const warmUpAtLeast = 256

// warmUp answers a fan-out of w enrollments of a step of its own, then
// waits until every one's event is delivered and the step collected.
// Nothing of it is measured: the worker's metrics and the receiver's
// counts are taken after it, and the rows read from there.
func (e *svcEnv) warmUp(w int) error {
	ids := make([]string, w)
	bodies := make([][]byte, w)
	for i := range w {
		ids[i] = warmEnrollment(i)
		bodies[i] = answerBody(ids[i], warmCommandUUID, "bench-warm-"+strconv.Itoa(i))
	}
	if err := e.postStep(ids, warmCommandUUID); err != nil {
		return fmt.Errorf("the warm-up's step: %w", err)
	}
	if b := e.burstBodies(bodies, nil); b.completed != w {
		return fmt.Errorf("the warm-up: %d of %d webhooks answered 200 (%v)", b.completed, w, b.errors)
	}
	if !e.recv.AwaitCompletions(w, 30*time.Second, 2*time.Minute) {
		_, distinct, _ := e.recv.Completions()
		return fmt.Errorf("the warm-up: %d of its %d events delivered", distinct, w)
	}
	if _, ok := e.awaitStepsEmpty(2 * time.Minute); !ok {
		return fmt.Errorf("the warm-up: its step was not collected within 2m")
	}
	// and counted: the worker counts a collection after its whole batch,
	// after the DELETE the bench saw, and the measured fan-out's counts
	// start from the next scrape (make bench at 133f42c: "the worker
	// counted 2 of 1 steps collected", the warm-up's counted late)
	s, err := awaitCollected(e.metrics, nil, 1, 10*time.Second)
	if err != nil {
		return fmt.Errorf("the warm-up: reading the worker's metrics: %w", err)
	}
	if got := int(s[seriesCollected]); got != 1 {
		return fmt.Errorf("the warm-up: the worker counted %d steps collected within 10 s, want 1", got)
	}
	return nil
}

// burst releases the webhooks of enrollments 0 to n-1 at once, at most
// e.inflight in flight, and times them.
func (e *svcEnv) burst(n int, control bool, pids map[string]int) *burstResult {
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = webhookBody(i, control)
	}
	return e.burstBodies(bodies, pids)
}

// burstBodies is burst of the given webhook bodies.
func (e *svcEnv) burstBodies(bodies [][]byte, pids map[string]int) *burstResult {
	n := len(bodies)
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
	var status func() map[string]int64
	if e.timeline != "" && pids != nil && pids[procMySQLD] != 0 {
		// the server the bench sees the CPU of is the one it can ask
		if conn, err := e.db.Conn(context.Background()); err == nil {
			defer conn.Close()
			status = statusReader(conn)
		}
	}
	before := cpuTimes(pids)
	start := time.Now()
	var tl *timeline
	if e.timeline != "" && pids != nil {
		tl = startTimeline(start, pids, before, func() int {
			mu.Lock()
			defer mu.Unlock()
			return b.completed
		}, status)
	}
	close(release)
	wg.Wait()
	b.wall = time.Since(start)
	if tl != nil {
		if err := tl.write(e.timeline, n); err != nil {
			progress("-timeline: %v", err)
		}
	}
	b.cpu, b.pids, b.cpuStart = since(before, cpuTimes(pids)), pids, before
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
