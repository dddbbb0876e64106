package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

var logOut = os.Stderr

func jsonLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append(b, '\n'), err
}

// rowOrder is the order implementations appear in tables and charts.
var rowOrder = []string{implFloor, "NanoCMD v0.7.0", "NanoCMD v0.7.1", "stepcollect storage", implService}

type key struct {
	impl, server string
	n            int
	control      bool
}

func index(results []*fanout.Result) map[key]*fanout.Result {
	m := map[key]*fanout.Result{}
	for _, r := range results {
		if r.Mode == fanout.ModeFanOut || r.Mode == "" {
			m[key{r.Impl, r.Server, r.N, r.Control}] = r
		}
	}
	return m
}

func report(results []*fanout.Result, large *largeTable, prof *profiled, version string, started time.Time, took time.Duration) string {
	var b strings.Builder
	host, _ := os.Hostname()
	idx := index(results)
	fmt.Fprintf(&b, "# stepcollect benchmarks\n\n")
	fmt.Fprintf(&b, "`make bench`, %s UTC, on %s (%d CPUs, %s/%s), MariaDB %s in a private `mariadbd` the benchmark starts "+
		"(max_connections 2000, buffer pool 512 MiB, durable commits: innodb_flush_log_at_trx_commit=1, no binary log); the whole run took %v.\n\n",
		started.UTC().Format("2006-01-02 15:04"), host, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, version, took.Round(time.Second))
	b.WriteString("Server settings, applied per session: **defaults** = REPEATABLE READ, lock wait 50 s, pool 128; " +
		"**stricter** = READ COMMITTED, lock wait 1 s, pool 1000. Every measurement has a fresh database and a pool warmed a few " +
		"connections at a time. Latencies are per result, from the moment all callers are released. " +
		"The floor is N concurrent single-row autocommit UPDATEs, each on its own row: one durable commit per result, " +
		"the least any design can cost. The service is the real `cmd/api` taking NanoMDM webhook requests over HTTP " +
		"(at most pool requests in flight) with the real `cmd/worker` collecting; its lag is the worker's " +
		"`stepcollect_collection_lag_seconds`.\n\n")

	for _, control := range []bool{false, true} {
		if control {
			b.WriteString("## Control: a step each\n\nThe same N results, each enrollment with its own step: nothing shared, so nothing to contend over.\n\n")
		} else {
			b.WriteString("## Fan-out: one step to N enrollments, all reporting at once\n\n")
			b.WriteString("![wall time by N, stricter](fanout-stricter.png) ![wall time by N, defaults](fanout-defaults.png)\n\n")
		}
		for _, cfg := range configs {
			fmt.Fprintf(&b, "### %s\n\n", cfg.Name)
			b.WriteString("| N | implementation | wall | p50 | p99 | completed | errors | stranded (steps/id_cmds/step_cmds) | × floor | × v0.7.1 | lag p50 / p99 |\n")
			b.WriteString("|--:|---|--:|--:|--:|--:|---|---|--:|--:|--:|\n")
			for _, n := range sortedNs(results) {
				for _, impl := range rowOrder {
					r := idx[key{impl, cfg.Name, n, control}]
					if r == nil {
						continue
					}
					ratio := func(base *fanout.Result) string {
						if base == nil || base.WallMS == 0 || base == r {
							return "–"
						}
						return fmt.Sprintf("%.2f×", r.WallMS/base.WallMS)
					}
					lag := "–"
					if impl == implService {
						lag = fmt.Sprintf("%.0f / %.0f ms", r.LagP50MS, r.LagP99MS)
					}
					fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %d | %s | %d/%d/%d | %s | %s | %s |\n", n, impl,
						dur(r.WallMS), dur(r.P50MS), dur(r.P99MS), r.Completed, errString(r.Errors),
						r.Stranded.Steps, r.Stranded.IDCommands, r.Stranded.StepCommands,
						ratio(idx[key{implFloor, cfg.Name, n, control}]), ratio(idx[key{"NanoCMD v0.7.1", cfg.Name, n, control}]), lag)
				}
			}
			b.WriteString("\n")
		}
	}

	b.WriteString(goals(results, idx))

	b.WriteString("## The uncontended path\n\n50 enrollments, each with its own step, answering one result after another (defaults). " +
		"What collection after the commit costs where nothing is shared.\n\n")
	b.WriteString("| implementation | commands a step | results | wall | p50 a result | p99 |\n|---|--:|--:|--:|--:|--:|\n")
	for _, impl := range rowOrder {
		for _, r := range results {
			if r.Mode == fanout.ModeUncontended && r.Impl == impl {
				fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s |\n", impl, r.Commands, r.N*r.Commands, dur(r.WallMS), dur(r.P50MS), dur(r.P99MS))
			}
		}
	}
	b.WriteString("\n")

	if large != nil {
		fmt.Fprintf(&b, "## CancelSteps and the sweeper against a large table\n\n%d `id_commands` rows present (%d steps of %d enrollments, each enrollment holding one row), defaults. "+
			"%d cancels of one enrollment's steps, then %d scoped to a workflow, one after another.\n\n", large.Rows, largeSteps, largePerStep, largeCancels, largeCancels)
		b.WriteString("| implementation | CancelSteps p50 | p99 | scoped to a workflow p50 | p99 | errors |\n|---|--:|--:|--:|--:|---|\n")
		for _, r := range large.Cancel {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.Impl, dur(r.P50MS), dur(r.P99MS), dur(r.P50Scoped), dur(r.P99Scoped), errString(r.Errors))
		}
		if len(large.SweepRuns) > 0 {
			fmt.Fprintf(&b, "\nstepcollect's sweeper, one full pass over %d steps with the 1,000,000 rows present and %d unreferenced steps planted: "+
				"%s, %s, %s (three passes; the first collected %d). Every statement is bounded: pages of 1000 steps by primary key, one `step_id` index probe each.\n",
				large.SweepSteps, large.Unreferenced, dur(large.SweepRuns[0]), dur(large.SweepRuns[1]), dur(large.SweepRuns[2]), large.Collected)
		}
		b.WriteString("\n")
	}
	if prof != nil {
		b.WriteString(prof.markdown())
	}
	b.WriteString("Raw results, one JSON object a measurement: `raw.jsonl`.\n")
	return b.String()
}

// goals states each goal beside the figures, as measured.
func goals(results []*fanout.Result, idx map[key]*fanout.Result) string {
	var b strings.Builder
	b.WriteString("## Goals\n\n")

	var bad []string
	for _, r := range results {
		if r.Mode != fanout.ModeFanOut || (r.Impl != "stepcollect storage" && r.Impl != implService) {
			continue
		}
		if sum(r.Errors) > 0 || r.Stranded != (fanout.Stranded{}) || r.Completed != r.N {
			bad = append(bad, fmt.Sprintf("%s %s N=%d%s: %d errors (%s), %d of %d completed, stranded %d/%d/%d",
				r.Impl, r.Server, r.N, ifs(r.Control, " control"), sum(r.Errors), errString(r.Errors), r.Completed, r.N,
				r.Stranded.Steps, r.Stranded.IDCommands, r.Stranded.StepCommands))
		}
	}
	if len(bad) == 0 {
		b.WriteString("- **Zero errors and nothing stranded for stepcollect at every N** (storage and service, both settings, both shapes): **met**.\n")
	} else {
		b.WriteString("- **Zero errors and nothing stranded for stepcollect at every N: missed** in " + fmt.Sprint(len(bad)) + " measurements:\n")
		for _, s := range bad {
			b.WriteString("  - " + s + "\n")
		}
	}

	for _, impl := range []string{"stepcollect storage", implService} {
		for _, cfg := range configs {
			r, base := idx[key{impl, cfg.Name, 3000, false}], idx[key{"NanoCMD v0.7.1", cfg.Name, 3000, false}]
			if r == nil || base == nil {
				continue
			}
			speedup := base.WallMS / r.WallMS
			verdict := "met"
			if speedup < 2 {
				verdict = fmt.Sprintf("missed by %.0f%%", (2-speedup)/2*100)
			}
			fmt.Fprintf(&b, "- **At N=3000, %s at least 2× faster than v0.7.1** (%s): %.2f× (%s vs %s): **%s**.\n",
				impl, cfg.Name, speedup, dur(r.WallMS), dur(base.WallMS), verdict)
		}
	}
	for _, cfg := range configs {
		var parts []string
		worst := 0.0
		for _, n := range sortedNs(results) {
			r, floor := idx[key{implService, cfg.Name, n, false}], idx[key{implFloor, cfg.Name, n, false}]
			if r == nil || floor == nil {
				continue
			}
			x := r.WallMS / floor.WallMS
			worst = max(worst, x)
			parts = append(parts, fmt.Sprintf("N=%d %.1f×", n, x))
		}
		if len(parts) == 0 {
			continue
		}
		verdict := "met"
		if worst > 3 {
			verdict = fmt.Sprintf("missed: up to %.1f×", worst)
		}
		fmt.Fprintf(&b, "- **The service within 3× of the floor** (%s, one step): %s: **%s**.\n", cfg.Name, strings.Join(parts, ", "), verdict)
	}
	b.WriteString("\n")
	return b.String()
}

func sortedNs(results []*fanout.Result) []int {
	seen := map[int]bool{}
	var ns []int
	for _, r := range results {
		if r.Mode == fanout.ModeFanOut && !seen[r.N] {
			seen[r.N] = true
			ns = append(ns, r.N)
		}
	}
	sort.Ints(ns)
	return ns
}

func dur(ms float64) string {
	switch {
	case ms == 0:
		return "–"
	case ms >= 10000:
		return fmt.Sprintf("%.1f s", ms/1000)
	case ms >= 100:
		return fmt.Sprintf("%.0f ms", ms)
	default:
		return fmt.Sprintf("%.1f ms", ms)
	}
}

func errString(m map[string]int) string {
	if sum(m) == 0 {
		return "0"
	}
	var parts []string
	for k, v := range m {
		if v > 0 {
			parts = append(parts, fmt.Sprintf("%d × %s", v, k))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func ifs(c bool, s string) string {
	if c {
		return s
	}
	return ""
}

var palette = map[string]color.Color{
	implFloor:             color.RGBA{120, 120, 120, 255},
	"NanoCMD v0.7.0":      color.RGBA{214, 39, 40, 255},
	"NanoCMD v0.7.1":      color.RGBA{255, 127, 14, 255},
	"stepcollect storage": color.RGBA{31, 119, 180, 255},
	implService:           color.RGBA{44, 160, 44, 255},
}

// charts draws wall time against N, one line per implementation, one chart
// per server setting, log scales on both axes.
func charts(results []*fanout.Result, ns []int, outDir string) error {
	idx := index(results)
	for _, cfg := range configs {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("One step to N enrollments, all reporting at once (%s)", cfg.Name)
		p.X.Label.Text = "N (enrollments)"
		p.Y.Label.Text = "wall time (ms)"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		p.Legend.Top, p.Legend.Left = true, true
		p.Add(plotter.NewGrid())
		for _, impl := range rowOrder {
			var pts plotter.XYs
			for _, n := range ns {
				if r := idx[key{impl, cfg.Name, n, false}]; r != nil && r.WallMS > 0 {
					pts = append(pts, plotter.XY{X: float64(n), Y: r.WallMS})
				}
			}
			if len(pts) == 0 {
				continue
			}
			line, points, err := plotter.NewLinePoints(pts)
			if err != nil {
				return err
			}
			line.Color, points.Color = palette[impl], palette[impl]
			line.Width = vg.Points(2)
			points.Shape = draw.CircleGlyph{}
			if impl == implFloor {
				line.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			p.Add(line, points)
			p.Legend.Add(impl, line, points)
		}
		if err := p.Save(9*vg.Inch, 5.5*vg.Inch, filepath.Join(outDir, "fanout-"+cfg.Name+".png")); err != nil {
			return err
		}
	}
	return nil
}
