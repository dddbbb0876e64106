package main

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// sampleEvery is the sustained run's sampling interval.
const sampleEvery = 250 * time.Millisecond

// stepMargin is how many more steps the sustained run creates than its
// length at the measured rate needs: a burst's rate is not a sustained
// one. Should they run out all the same, the run ends there and says so.
const stepMargin = 2.0

// sustainedSample is one look at the service during the sustained run.
// Counts are since the load started.
type sustainedSample struct {
	T          float64 `json:"t_s"`         // since the load started
	Committed  int     `json:"committed"`   // webhook 200s
	Collected  int     `json:"collected"`   // the worker's stepcollect_steps_collected_total
	Delivered  int     `json:"delivered"`   // distinct step.completed at the receiver
	QueueDepth int     `json:"queue_depth"` // asynq_queue_size{queue="stepcollect"}
	Outbox     int     `json:"outbox"`      // rows in stepcollect_outbox
	LagN       int     `json:"lag_n"`       // steps collected since the previous sample
	LagP50MS   float64 `json:"lag_p50_ms"`  // their collection lag, from the histogram's delta
	LagP99MS   float64 `json:"lag_p99_ms"`  //
	Backlog    int     `json:"backlog"`     // committed − collected
	Undeliv    int     `json:"undelivered"` // committed − delivered
	ScrapeMS   float64 `json:"scrape_ms"`   // how long the look took
	LoadActive bool    `json:"load_active"` // the load was still running
}

// sustainedResult is the sustained run.
type sustainedResult struct {
	Mode      string         `json:"mode"` // "sustained"
	Server    string         `json:"server"`
	Inflight  int            `json:"inflight"`
	TargetS   float64        `json:"target_s"`
	LoadS     float64        `json:"load_s"` // the load's actual length
	RanOut    bool           `json:"ran_out"`
	Rate      float64        `json:"rate_basis_per_s"` // the api's rate the steps were sized on
	RateFrom  string         `json:"rate_from"`
	Steps     int            `json:"steps"` // pre-created
	Committed int            `json:"committed"`
	Errors    map[string]int `json:"errors"`
	P50MS     float64        `json:"p50_ms"` // webhook latency
	P99MS     float64        `json:"p99_ms"`
	// During the load: per second of it.
	CommittedPerS float64 `json:"committed_per_s"`
	CollectedPerS float64 `json:"collected_per_s"`
	DeliveredPerS float64 `json:"delivered_per_s"`
	// After the load: until the worker's count reached the 200s, and until
	// the last of their distinct events arrived (zero: not within the wait).
	CollectedDrainMS float64 `json:"collected_drain_ms"`
	DeliveredDrainMS float64 `json:"delivered_drain_ms"`
	Collected        int     `json:"collected"`
	EventsReceived   int     `json:"events_received"`
	EventsDistinct   int     `json:"events_distinct"`
	// Collection lag of every step the run's results released.
	LagP50MS      float64           `json:"lag_p50_ms"`
	LagP99MS      float64           `json:"lag_p99_ms"`
	LagWithin1s   float64           `json:"lag_share_within_1s"`
	MaxWindowP99  float64           `json:"max_window_lag_p99_ms"`
	MaxQueueDepth int               `json:"max_queue_depth"`
	MaxOutbox     int               `json:"max_outbox"`
	MaxBacklog    int               `json:"max_backlog"`
	Samples       []sustainedSample `json:"samples"`
}

// apiRate is the api's results/s in this run's service rows: the control
// (a step each) row of cfg at the largest N of at least 1000; zero if none.
func (r *runner) apiRate(cfg serverConfig) (float64, string) {
	var best *fanout.Result
	for _, res := range r.results {
		if res.Impl == implService && res.Mode == fanout.ModeFanOut && res.Control && res.Server == cfg.Name &&
			res.N >= 1000 && res.WallMS > 0 && (best == nil || res.N > best.N) {
			best = res
		}
	}
	if best == nil {
		return 0, ""
	}
	return float64(best.Completed) / (best.WallMS / 1000), fmt.Sprintf("the %s control row at N=%d", cfg.Name, best.N)
}

// sustained runs the api at its full rate for d: steps of one enrollment
// each, created beforehand for d at the api's measured rate (with a
// margin), then inflight webhook requests kept going for d, the service
// looked at every sampleEvery, through the load and until everything it
// committed was collected and delivered.
func (r *runner) sustained(cfg serverConfig, d time.Duration, outDir string) (*sustainedResult, error) {
	r.step++
	progress("[%d/%d] %-28s %-8s %v at full rate, a step each …", r.step, max(r.total, r.step), implService, cfg.Name, d)
	inflight := cfg.Pool
	e, err := r.startEnv(cfg, 1, inflight, "")
	if err != nil {
		return nil, err
	}
	defer e.close()
	res := &sustainedResult{Mode: "sustained", Server: cfg.Name, Inflight: inflight, TargetS: d.Seconds(), Errors: map[string]int{}}

	next := 0 // the next enrollment to use
	res.Rate, res.RateFrom = r.apiRate(cfg)
	if res.Rate == 0 {
		// no service row to go by: a burst of our own
		const calib = 3000
		fmt.Fprintf(logOut, " calibrating (%d results) …", calib)
		if err := e.createSteps(0, calib, true, 32); err != nil {
			return nil, err
		}
		b := e.burst(calib, true, nil)
		// the rate of the burst's second half: the first warms the api's
		// pool, which a sustained load does not pay for
		done := slices.Clone(b.lat) // each from the release: when it completed
		slices.Sort(done)
		res.Rate = float64(calib-calib/2) / (done[calib-1] - done[calib/2]).Seconds()
		res.RateFrom = fmt.Sprintf("the second half of a burst of %d results in the same setup", calib)
		e.awaitStepsEmpty(2 * time.Minute)
		e.recv.AwaitCompletions(b.completed, 30*time.Second, 2*time.Minute)
		next = calib
	}
	res.Steps = int(math.Ceil(res.Rate*d.Seconds()*stepMargin)) + inflight
	fmt.Fprintf(logOut, " %.0f results/s (%s); creating %d steps …", res.Rate, res.RateFrom, res.Steps)
	created := time.Now()
	if err := e.createSteps(next, res.Steps, true, 32); err != nil {
		return nil, err
	}
	fmt.Fprintf(logOut, " %v; running …", time.Since(created).Round(time.Second))
	// whatever the creation left in the outbox or the queue drains first
	for deadline := time.Now().Add(30 * time.Second); e.outboxPending() != 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
	}

	base, err := scrapeAll(e.metrics...)
	if err != nil {
		return nil, err
	}
	received0, distinct0, _ := e.recv.Completions()
	first, end := next, next+res.Steps

	var (
		idx       atomic.Int64
		committed atomic.Int64
		ranOut    atomic.Bool
		mu        sync.Mutex
		lat       = make([]time.Duration, 0, res.Steps)
		wg        sync.WaitGroup
	)
	idx.Store(int64(first))
	start := time.Now()
	deadline := start.Add(d)
	var loadDone atomic.Bool

	// the sampler
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		prev := base
		t := time.NewTicker(sampleEvery)
		defer t.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-t.C:
			}
			t0 := time.Now()
			s, err := scrapeAll(e.metrics...)
			if err != nil {
				continue
			}
			_, distinct, _ := e.recv.Completions()
			sm := sustainedSample{
				T:          t0.Sub(start).Seconds(),
				Committed:  int(committed.Load()),
				Collected:  int(s[seriesCollected] - base[seriesCollected]),
				Delivered:  distinct - distinct0,
				QueueDepth: int(s[seriesQueueDepth]),
				Outbox:     e.outboxPending(),
				LoadActive: !loadDone.Load(),
			}
			bs := s.lagBuckets(prev)
			sm.LagN = int(countOf(bs))
			sm.LagP50MS, sm.LagP99MS = quantileMS(bs, 0.5), quantileMS(bs, 0.99)
			sm.Backlog, sm.Undeliv = sm.Committed-sm.Collected, sm.Committed-sm.Delivered
			sm.ScrapeMS = fanout.MS(time.Since(t0))
			prev = s
			mu.Lock()
			res.Samples = append(res.Samples, sm)
			mu.Unlock()
		}
	}()

	for range inflight {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				i := int(idx.Add(1) - 1)
				if i >= end {
					ranOut.Store(true)
					return
				}
				t0 := time.Now()
				class := e.webhook(webhookBody(i, true))
				l := time.Since(t0)
				mu.Lock()
				lat = append(lat, l)
				if class != "" {
					res.Errors[class]++
				}
				mu.Unlock()
				if class == "" {
					committed.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	loadEnd := time.Now()
	loadDone.Store(true)
	res.LoadS = loadEnd.Sub(start).Seconds()
	res.RanOut = ranOut.Load()
	res.Committed = int(committed.Load())
	res.P50MS, res.P99MS = fanout.Quantiles(lat)
	atEnd, err := scrapeAll(e.metrics...)
	if err != nil {
		return nil, err
	}
	_, distinctEnd, _ := e.recv.Completions()
	res.CommittedPerS = float64(res.Committed) / res.LoadS
	res.CollectedPerS = (atEnd[seriesCollected] - base[seriesCollected]) / res.LoadS
	res.DeliveredPerS = float64(distinctEnd-distinct0) / res.LoadS
	fmt.Fprintf(logOut, " %d results in %.1f s; draining …", res.Committed, res.LoadS)

	// the drain: the worker's count looked at every 50 ms until it reaches
	// the 200s (or stalls), then the receiver until every event arrived
	lastCount, lastProgress := -1.0, time.Now()
	for {
		s, err := scrapeAll(e.metrics...)
		if err == nil {
			c := s[seriesCollected] - base[seriesCollected]
			if c >= float64(res.Committed) {
				res.CollectedDrainMS = fanout.MS(time.Since(loadEnd))
				break
			}
			if c != lastCount {
				lastCount, lastProgress = c, time.Now()
			}
		}
		if time.Since(lastProgress) > 30*time.Second || time.Since(loadEnd) > 5*time.Minute {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if e.recv.AwaitCompletions(distinct0+res.Committed, 30*time.Second, 5*time.Minute) {
		_, _, last := e.recv.Completions()
		res.DeliveredDrainMS = fanout.MS(last.Sub(loadEnd))
	}
	time.Sleep(2 * sampleEvery) // a last sample or two of the settled state
	close(stopSampling)
	<-sampled

	final, err := scrapeAll(e.metrics...)
	if err != nil {
		return nil, err
	}
	res.Collected = int(final[seriesCollected] - base[seriesCollected])
	received, distinct, _ := e.recv.Completions()
	res.EventsReceived, res.EventsDistinct = received-received0, distinct-distinct0
	bs := final.lagBuckets(base)
	res.LagP50MS, res.LagP99MS, res.LagWithin1s = quantileMS(bs, 0.5), quantileMS(bs, 0.99), shareWithin(bs, 1)
	for _, sm := range res.Samples {
		if sm.LagN > 0 {
			res.MaxWindowP99 = max(res.MaxWindowP99, sm.LagP99MS)
		}
		res.MaxQueueDepth = max(res.MaxQueueDepth, sm.QueueDepth)
		res.MaxOutbox = max(res.MaxOutbox, sm.Outbox)
		res.MaxBacklog = max(res.MaxBacklog, sm.Backlog)
	}
	fmt.Fprintf(logOut, " collected +%s, delivered +%s after the load; lag p99 %.0f ms, max queue %d, max outbox %d\n",
		drainString(res.CollectedDrainMS), drainString(res.DeliveredDrainMS), res.LagP99MS, res.MaxQueueDepth, res.MaxOutbox)
	if err := sustainedChart(res, filepath.Join(outDir, "sustained.png")); err != nil {
		return nil, fmt.Errorf("sustained chart: %w", err)
	}
	return res, nil
}

func drainString(ms float64) string {
	if ms == 0 {
		return "not within the wait"
	}
	return dur(ms)
}

// sustainedChart draws the sustained run over time: throughput, collection
// lag, and what waits (collect tasks, outbox rows, uncollected steps).
func sustainedChart(res *sustainedResult, path string) error {
	loadEnd := res.LoadS
	vline := func(p *plot.Plot, ymax float64) error {
		l, err := plotter.NewLine(plotter.XYs{{X: loadEnd, Y: 0}, {X: loadEnd, Y: ymax}})
		if err != nil {
			return err
		}
		l.Color = color.Gray{Y: 120}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(l)
		return nil
	}
	addLine := func(p *plot.Plot, name string, c color.Color, pts plotter.XYs, dashed bool) error {
		if len(pts) == 0 {
			return nil
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color, l.Width = c, vg.Points(1.5)
		if dashed {
			l.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		}
		p.Add(l)
		p.Legend.Add(name, l)
		return nil
	}
	newPlot := func(title, y string) *plot.Plot {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "seconds since the load started (dashed grey: the load ends)"
		p.Y.Label.Text = y
		p.Legend.Top, p.Legend.Left = true, false
		p.Add(plotter.NewGrid())
		return p
	}
	blue, green, orange, red := color.RGBA{31, 119, 180, 255}, color.RGBA{44, 160, 44, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{214, 39, 40, 255}

	// throughput over the trailing second (250 ms alone is too noisy to read)
	rates := newPlot(fmt.Sprintf("Sustained load (%s, %d in flight): throughput over the trailing second", res.Server, res.Inflight), "per second")
	var com, col, del plotter.XYs
	for i, j := 1, 0; i < len(res.Samples); i++ {
		b := res.Samples[i]
		for j+1 < i && res.Samples[j+1].T <= b.T-1 {
			j++
		}
		a := res.Samples[j]
		dt := b.T - a.T
		if dt <= 0 {
			continue
		}
		com = append(com, plotter.XY{X: b.T, Y: float64(b.Committed-a.Committed) / dt})
		col = append(col, plotter.XY{X: b.T, Y: float64(b.Collected-a.Collected) / dt})
		del = append(del, plotter.XY{X: b.T, Y: float64(b.Delivered-a.Delivered) / dt})
	}
	for _, l := range []struct {
		name string
		c    color.Color
		pts  plotter.XYs
	}{{"results committed (webhook 200s)", blue, com}, {"steps collected", green, col}, {"events delivered", orange, del}} {
		if err := addLine(rates, l.name, l.c, l.pts, false); err != nil {
			return err
		}
	}

	// collection lag per sample interval
	lag := newPlot("Collection lag of the steps collected in each 250 ms (the worker's histogram)", "ms")
	var p50, p99 plotter.XYs
	for _, s := range res.Samples {
		if s.LagN == 0 {
			continue
		}
		p50 = append(p50, plotter.XY{X: s.T, Y: s.LagP50MS})
		p99 = append(p99, plotter.XY{X: s.T, Y: s.LagP99MS})
	}
	if err := addLine(lag, "p50", green, p50, false); err != nil {
		return err
	}
	if err := addLine(lag, "p99", red, p99, false); err != nil {
		return err
	}
	if len(res.Samples) > 0 {
		goal := plotter.XYs{{X: 0, Y: 1000}, {X: res.Samples[len(res.Samples)-1].T, Y: 1000}}
		if err := addLine(lag, "goal: p99 under 1 s", color.Gray{Y: 60}, goal, true); err != nil {
			return err
		}
	}

	// what waits
	depth := newPlot("What waits", "count")
	var q, ob, bl plotter.XYs
	for _, s := range res.Samples {
		q = append(q, plotter.XY{X: s.T, Y: float64(s.QueueDepth)})
		ob = append(ob, plotter.XY{X: s.T, Y: float64(s.Outbox)})
		bl = append(bl, plotter.XY{X: s.T, Y: float64(s.Backlog)})
	}
	for _, l := range []struct {
		name string
		c    color.Color
		pts  plotter.XYs
	}{{"collect queue depth (asynq tasks)", blue, q}, {"outbox pending (events)", orange, ob}, {"uncollected (200s − steps collected)", green, bl}} {
		if err := addLine(depth, l.name, l.c, l.pts, false); err != nil {
			return err
		}
	}

	// one time axis for all three, and room above the lines for the legends
	tmax := loadEnd
	if len(res.Samples) > 0 {
		tmax = max(tmax, res.Samples[len(res.Samples)-1].T)
	}
	for _, p := range []*plot.Plot{rates, lag, depth} {
		p.X.Min, p.X.Max = 0, tmax
		p.Y.Min = 0
	}
	rates.Y.Max = rates.Y.Max * 1.3
	lag.Y.Max = max(lag.Y.Max, 1000) * 1.3
	depth.Y.Max = max(depth.Y.Max, 1) * 1.3
	for _, p := range []*plot.Plot{rates, lag, depth} {
		if err := vline(p, p.Y.Max); err != nil {
			return err
		}
	}

	const w, h = 10 * vg.Inch, 11 * vg.Inch
	c, err := draw.NewFormattedCanvas(w, h, "png")
	if err != nil {
		return err
	}
	plots := [][]*plot.Plot{{rates}, {lag}, {depth}}
	canvases := plot.Align(plots, draw.Tiles{Rows: 3, Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: 2 * vg.Millimeter, PadBottom: 2 * vg.Millimeter, PadLeft: 2 * vg.Millimeter, PadRight: 2 * vg.Millimeter}, draw.New(c))
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
