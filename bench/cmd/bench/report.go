package main

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"runtime"
	"slices"
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

// index maps each fan-out row to its result; where the floor and the
// service ran as alternated pairs (-pairs), to the pair whose ratio is the
// median, so that tables, charts and goals show one pair measured together.
func index(results []*fanout.Result) map[key]*fanout.Result {
	m := map[key]*fanout.Result{}
	for _, r := range results {
		if r.Mode == fanout.ModeFanOut || r.Mode == "" {
			m[resultKey(r)] = r
		}
	}
	for k, ps := range pairsOf(results) {
		med := medianPair(ps)
		m[k], m[key{implFloor, k.server, k.n, k.control}] = med.service, med.floor
	}
	return m
}

func resultKey(r *fanout.Result) key { return key{r.Impl, r.Server, r.N, r.Control} }

// pairRun is one alternated pair: the floor, then the service.
type pairRun struct{ floor, service *fanout.Result }

func (p pairRun) ratio() float64 { return p.service.WallMS / p.floor.WallMS }

// pairsOf is the alternated pairs of each (setting, N, shape) where there
// are any, by the service's key, in the order they ran.
func pairsOf(results []*fanout.Result) map[key][]pairRun {
	floors := map[key]map[int]*fanout.Result{}
	for _, r := range results {
		if r.Pair > 0 && r.Impl == implFloor {
			k := resultKey(r)
			if floors[k] == nil {
				floors[k] = map[int]*fanout.Result{}
			}
			floors[k][r.Pair] = r
		}
	}
	out := map[key][]pairRun{}
	for _, r := range results {
		if r.Pair == 0 || r.Impl != implService {
			continue
		}
		k := resultKey(r)
		if f := floors[key{implFloor, k.server, k.n, k.control}][r.Pair]; f != nil && f.WallMS > 0 {
			out[k] = append(out[k], pairRun{floor: f, service: r})
		}
	}
	return out
}

// medianPair is the pair whose ratio is the median; of an even number of
// pairs, the higher of the middle two.
func medianPair(ps []pairRun) pairRun {
	s := slices.Clone(ps)
	sort.SliceStable(s, func(i, j int) bool { return s[i].ratio() < s[j].ratio() })
	return s[len(s)/2]
}

// pairsMarkdown is the table of the alternated pairs, where there are any.
func pairsMarkdown(results []*fanout.Result) string {
	pairs := pairsOf(results)
	if len(pairs) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("## The floor and the service, alternated\n\n" +
		"Where the goal compares them (one step to N, N=3000 and 10000, defaults and stricter) the floor and the service ran " +
		"as alternated pairs (`-pairs`): the floor, NanoCMD's and the storage's rows, the service, then the floor and the service again. " +
		"On this VM the CPU time a result costs moves by up to a quarter between runs minutes apart, for every process alike, " +
		"so one run of each is a draw. The fan-out tables, the charts and the goal show the pair whose ratio is the median (**bold**); " +
		"every run counts for the collection and delivery goals. CPU a result is the server's and the bench's (floor) and every " +
		"process's (service) during the burst. The service's **to done** is every process's from the release to its last event " +
		"delivered and its step collected: the whole fan-out's work, whatever of the delivery the worker left for after the last 200 " +
		"(a worker that delivers less during the burst shortens the burst, not the work).\n\n")
	b.WriteString("| setting | N | pair | floor | service | × floor | CPU a result: floor / service | service to done (api / worker / mysqld / bench) | service errors | stranded (steps/id_cmds/step_cmds) | events received / distinct |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|---|---|--:|\n")
	for _, cfg := range configs {
		for _, n := range sortedNs(results) {
			ps := pairs[key{implService, cfg.Name, n, false}]
			if len(ps) == 0 {
				continue
			}
			med := medianPair(ps)
			for _, p := range ps {
				x := fmt.Sprintf("%.2f×", p.ratio())
				if p == med {
					x = "**" + x + "**"
				}
				f, sv := p.floor, p.service
				fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %.3f / %.3f ms | %s | %s | %d/%d/%d | %s |\n", cfg.Name, n, sv.Pair,
					dur(f.WallMS), dur(sv.WallMS), x, cpuPerResult(f), cpuPerResult(sv), cpuToDone(sv), errString(sv.Errors),
					sv.Stranded.Steps, sv.Stranded.IDCommands, sv.Stranded.StepCommands, eventsString(sv.EventsReceived, sv.EventsDistinct))
			}
		}
	}
	b.WriteString("\n")
	return b.String()
}

// cpuPerResult is the CPU time of every process a row measured, in ms a
// result.
func cpuPerResult(r *fanout.Result) float64 {
	total := 0.0
	for _, v := range r.CPU {
		total += v
	}
	return total / float64(max(r.N, 1))
}

// cpuToDone is a service row's CPU a result from the release to its last
// event delivered, in all and by process ("–" where it was not measured).
func cpuToDone(r *fanout.Result) string {
	if len(r.CPUToDone) == 0 {
		return "–"
	}
	n := float64(max(r.N, 1))
	var total, workers float64
	for name, v := range r.CPUToDone {
		total += v
		if strings.HasPrefix(name, procWorker) {
			workers += v
		}
	}
	c := r.CPUToDone
	return fmt.Sprintf("%.3f ms (%.3f / %.3f / %.3f / %.3f)", total/n, c[procAPI]/n, workers/n, c[procMySQLD]/n, c[procBench]/n)
}

// serviceRuns is every service result at k: one, or one per pair.
func serviceRuns(results []*fanout.Result, k key) []*fanout.Result {
	var out []*fanout.Result
	for _, r := range results {
		if (r.Mode == fanout.ModeFanOut || r.Mode == "") && resultKey(r) == k {
			out = append(out, r)
		}
	}
	return out
}

func report(results []*fanout.Result, side sideRuns, version string, mysqlSrv, galera, group *dbServer, started time.Time, took time.Duration) string {
	sus, drains, e2e, large, prof := side.sus, side.drains, side.e2e, side.large, side.prof
	var b strings.Builder
	host, _ := os.Hostname()
	idx := index(results)
	fmt.Fprintf(&b, "# stepcollect benchmarks\n\n")
	fmt.Fprintf(&b, "`make bench`, %s UTC, on %s (%d CPUs, %s/%s), MariaDB %s in a private `mariadbd` the benchmark starts "+
		"(max_connections 2000, buffer pool 512 MiB, durable commits: innodb_flush_log_at_trx_commit=1, %s); the whole run took %v.\n\n",
		started.UTC().Format("2006-01-02 15:04"), host, runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, version,
		"binary log on with sync_binlog=1, written only in the binlog setting", took.Round(time.Second))
	if mysqlSrv != nil {
		fmt.Fprintf(&b, "The **MySQL** settings ran on MySQL %s (`-mysql-dsn`; its own server settings), pools %s.\n\n", mysqlSrv.version, mysqlPools())
	}
	if galera != nil {
		fmt.Fprintf(&b, "The **Galera defaults** setting ran on a private three-node Galera cluster of MariaDB %s on this same machine (`-galera`; "+
			"each node max_connections 2000, buffer pool 512 MiB, durable commits, no binary log), the defaults' session settings, every row's "+
			"clients on node 0: each commit is certified by the group and applied by the two other nodes, which share the same CPUs.\n\n", galera.version)
	}
	if group != nil {
		fmt.Fprintf(&b, "The **Group Replication defaults** setting ran on a private three-member MySQL Group Replication group of MySQL %s in single-primary mode "+
			"on this same machine (`-group-replication`; each member max_connections 2000, buffer pool 512 MiB, durable commits), every row's clients on the primary: "+
			"each commit waits for the group's consensus and is applied by the two other members, which share the same CPUs.\n\n", group.version)
	}
	b.WriteString("Server settings, applied per session: **defaults** = REPEATABLE READ, lock wait 50 s, pool 128; " +
		"**stricter** = READ COMMITTED, lock wait 1 s, pool 1000, both without the binary log (sql_log_bin=0); " +
		"**binlog** = defaults with every transaction in the binary log, sync_binlog=1 (what replicas, and so any failover, need). Every measurement has a fresh database and a pool warmed a few " +
		"connections at a time. Latencies are per result, from the moment all callers are released. " +
		"The floor is N concurrent single-row autocommit UPDATEs, each on its own row: one durable commit per result, " +
		"the least any design can cost. The service is the real `cmd/api` taking NanoMDM webhook requests over HTTP " +
		"(at most pool requests in flight) with the real `cmd/worker` collecting (its sweeper off: `-sweep-interval 0`) and " +
		"delivering `step.completed` events to a receiver in the bench process (`-callback-url`), which answers 200 at once and " +
		"records when each `event_id` first arrived. The service starts warm, as every pool does: a fan-out of its own (as many " +
		"enrollments as the pool, at least 256, at most N) answered, delivered and collected before the measured one, so that the " +
		"api's connections to the database and the worker's to the receiver are open; the events, lag and steps collected are the " +
		"measured fan-out's alone. **lag** is the worker's `stepcollect_collection_lag_seconds` (from the commit " +
		"that released a step to its deletion; one observation in the one-step shape). **collected after last 200** is from the " +
		"last webhook 200 to the steps table first seen empty (`SELECT EXISTS (SELECT 1 FROM steps)` every 10 ms on the bench's " +
		"own connection); **delivered after last 200** is from the last webhook 200 to the arrival of the last of the N distinct " +
		"`step.completed` events; **events** are the `step.completed` POSTs received / the distinct event ids among them " +
		"(the difference: duplicates).\n\n")

	for _, control := range []bool{false, true} {
		if !hasFanOut(idx, control) {
			continue // a run of other sections alone (-only dropin)
		}
		if control {
			b.WriteString("## Control: a step each\n\nThe same N results, each enrollment with its own step: nothing shared, so nothing to contend over.\n\n")
		} else {
			b.WriteString("## Fan-out: one step to N enrollments, all reporting at once\n\n")
		}
		if !control && len(sortedNs(results)) >= 2 { // see charts
			b.WriteString("![wall time by N, stricter](fanout-stricter.png) ![wall time by N, defaults](fanout-defaults.png)\n\n")
			b.WriteString("![time per result by N, stricter](perresult-stricter.png) ![time per result by N, defaults](perresult-defaults.png)\n\n")
		}
		for _, cfg := range configs {
			if !slices.ContainsFunc(rowOrder, func(impl string) bool {
				return slices.ContainsFunc(sortedNs(results), func(n int) bool { return idx[key{impl, cfg.Name, n, control}] != nil })
			}) {
				continue
			}
			fmt.Fprintf(&b, "### %s\n\n", cfg.Name)
			b.WriteString("| N | implementation | wall | p50 | p99 | completed | errors | stranded (steps/id_cmds/step_cmds) | × floor | × v0.7.1 | lag p50 / p99 | collected after last 200 | delivered after last 200 | events received / distinct |\n")
			b.WriteString("|--:|---|--:|--:|--:|--:|---|---|--:|--:|--:|--:|--:|--:|\n")
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
					lag, collected, delivered, events := "–", "–", "–", "–"
					if impl == implService {
						lag = fmt.Sprintf("%.0f / %.0f ms", r.LagP50MS, r.LagP99MS)
						collected = afterString(r.CollectedAfterMS, r.Stranded.Steps == 0)
						delivered = afterString(r.DeliveredAfterMS, r.EventsDistinct >= r.N)
						if r.EventsDistinct < r.N {
							delivered = fmt.Sprintf("%d of %d arrived", r.EventsDistinct, r.N)
						}
						events = eventsString(r.EventsReceived, r.EventsDistinct)
					}
					fmt.Fprintf(&b, "| %d | %s | %s | %s | %s | %d | %s | %d/%d/%d | %s | %s | %s | %s | %s | %s |\n", n, impl,
						dur(r.WallMS), dur(r.P50MS), dur(r.P99MS), r.Completed, errString(r.Errors),
						r.Stranded.Steps, r.Stranded.IDCommands, r.Stranded.StepCommands,
						ratio(idx[key{implFloor, cfg.Name, n, control}]), ratio(idx[key{"NanoCMD v0.7.1", cfg.Name, n, control}]),
						lag, collected, delivered, events)
				}
			}
			b.WriteString("\n")
		}
	}

	b.WriteString(pairsMarkdown(results))
	b.WriteString(goals(results, idx, sus, drains, e2e, side.dropin))
	if sus != nil {
		b.WriteString(sus.markdown())
	}
	if len(drains) > 0 {
		b.WriteString(drainMarkdown(drains))
	}
	if e2e != nil {
		b.WriteString(e2e.markdown())
	}
	if side.dropin != nil {
		b.WriteString(side.dropin.markdown())
	}
	if side.real != nil {
		b.WriteString(side.real.markdown())
	}
	if side.hub != nil {
		b.WriteString(side.hub.markdown())
	}

	if slices.ContainsFunc(results, func(r *fanout.Result) bool { return r.Mode == fanout.ModeUncontended }) {
		b.WriteString(uncontendedMarkdown(results))
	}
	if large != nil && len(large.Cancel) > 0 {
		b.WriteString(large.markdown())
	}
	if prof != nil {
		b.WriteString(prof.markdown())
	}
	b.WriteString("Raw results, one JSON object a measurement: `raw.jsonl`.\n")
	return b.String()
}

// hasFanOut reports whether the run measured any fan-out row of the shape.
func hasFanOut(idx map[key]*fanout.Result, control bool) bool {
	for k := range idx {
		if k.control == control {
			return true
		}
	}
	return false
}

// uncontendedMarkdown is the table of the uncontended path.
func uncontendedMarkdown(results []*fanout.Result) string {
	var b strings.Builder
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
	return b.String()
}

// markdown is the table of CancelSteps and the sweeper against a large
// table.
func (large *largeTable) markdown() string {
	var b strings.Builder
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
	return b.String()
}

// goals states each goal beside the figures, as measured.
func goals(results []*fanout.Result, idx map[key]*fanout.Result, sus *sustainedResult, drains []*drainResult, e2e *e2eResult, dropin *dropInResult) string {
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
		if r.Impl == implService {
			steps := 1
			if r.Control {
				steps = r.N
			}
			if r.EventsDistinct != r.N || r.OutboxLeft != 0 || r.StepsCollected != steps {
				bad = append(bad, fmt.Sprintf("%s %s N=%d%s: %d of %d distinct events arrived, %d left in the outbox, the worker counted %d of %d steps collected",
					r.Impl, r.Server, r.N, ifs(r.Control, " control"), r.EventsDistinct, r.N, r.OutboxLeft, r.StepsCollected, steps))
			}
		}
	}
	for _, d := range drains {
		if sum(d.Errors) > 0 || d.Stranded != (fanout.Stranded{}) || d.EventsDistinct != d.Completed || d.OutboxLeft != 0 || d.StepsCollected != d.StepRows {
			bad = append(bad, fmt.Sprintf("worker throughput, %d worker(s): %d errors, stranded %d/%d/%d, %d of %d distinct events, %d left in the outbox, %d of %d steps counted collected",
				d.Workers, sum(d.Errors), d.Stranded.Steps, d.Stranded.IDCommands, d.Stranded.StepCommands, d.EventsDistinct, d.Completed, d.OutboxLeft, d.StepsCollected, d.StepRows))
		}
	}
	if sus != nil && (sum(sus.Errors) > 0 || sus.Collected != sus.Committed || sus.EventsDistinct != sus.Committed) {
		bad = append(bad, fmt.Sprintf("sustained: %d errors, %d of %d steps collected, %d of %d distinct events", sum(sus.Errors), sus.Collected, sus.Committed, sus.EventsDistinct, sus.Committed))
	}
	measured := len(drains) > 0 || sus != nil || slices.ContainsFunc(results, func(r *fanout.Result) bool {
		return r.Mode == fanout.ModeFanOut && (r.Impl == "stepcollect storage" || r.Impl == implService)
	})
	if len(bad) == 0 && measured {
		b.WriteString("- **Zero errors and nothing stranded for stepcollect at every N** (storage and service, both settings, both shapes; " +
			"for the service also every event delivered, the outbox empty and every step counted collected): **met**.\n")
	} else if len(bad) > 0 {
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
	pairs := pairsOf(results)
	for _, cfg := range configs {
		var parts []string
		worst, judged := 0.0, 0
		for _, n := range sortedNs(results) {
			r, floor := idx[key{implService, cfg.Name, n, false}], idx[key{implFloor, cfg.Name, n, false}]
			if r == nil || floor == nil {
				continue
			}
			x := r.WallMS / floor.WallMS
			part := fmt.Sprintf("N=%d %.1f×", n, x)
			if ps := pairs[key{implService, cfg.Name, n, false}]; len(ps) > 1 {
				xs := make([]string, len(ps))
				for i, p := range ps {
					xs[i] = fmt.Sprintf("%.2f×", p.ratio())
				}
				part += fmt.Sprintf(" (the median of %d alternated pairs: %s)", len(ps), strings.Join(xs, ", "))
			}
			parts = append(parts, part)
			if goalN[n] {
				worst = max(worst, x)
				judged++
			}
		}
		if judged == 0 {
			continue
		}
		verdict := "met"
		if worst > 3 {
			verdict = fmt.Sprintf("missed: up to %.1f×", worst)
		}
		fmt.Fprintf(&b, "- **The service within 3× of the floor at N=3000 and N=10000** (%s, one step): %s: **%s**.\n", cfg.Name, strings.Join(parts, ", "), verdict)
	}

	// after the last 200: the service at N=3000 and N=10000, both shapes,
	// both settings
	var collectedParts, deliveredParts, collectedMiss, deliveredMiss []string
	for _, control := range []bool{false, true} {
		for _, cfg := range configs {
			for _, n := range sortedNs(results) {
				r := idx[key{implService, cfg.Name, n, control}]
				if r == nil || !goalN[n] {
					continue
				}
				name := fmt.Sprintf("%s %s N=%d", ifs(control, "a step each,")+ifs(!control, "one step,"), cfg.Name, n)
				// every run counts here, not only the median pair's
				for _, run := range serviceRuns(results, key{implService, cfg.Name, n, control}) {
					rn := name
					if run.Pair > 0 {
						rn = fmt.Sprintf("%s pair %d", name, run.Pair)
					}
					cOK := run.Stranded.Steps == 0 && run.CollectedAfterMS <= 1000 && run.LagP99MS <= 1000
					dOK := run.EventsDistinct >= run.N && run.DeliveredAfterMS <= 2000
					c := fmt.Sprintf("%s: %s, lag p99 %.0f ms", rn, afterString(run.CollectedAfterMS, run.Stranded.Steps == 0), run.LagP99MS)
					d := fmt.Sprintf("%s: %s", rn, afterString(run.DeliveredAfterMS, run.EventsDistinct >= run.N))
					collectedParts, deliveredParts = append(collectedParts, c), append(deliveredParts, d)
					if !cOK {
						collectedMiss = append(collectedMiss, c)
					}
					if !dOK {
						deliveredMiss = append(deliveredMiss, d)
					}
				}
			}
		}
	}
	verdict := func(all, miss []string) string {
		if len(miss) == 0 {
			return "**met**"
		}
		return fmt.Sprintf("**missed** in %d of %d", len(miss), len(all))
	}
	if len(collectedParts) > 0 {
		fmt.Fprintf(&b, "- **Steps collected within 1 s of the last 200, lag p99 under 1 s** (the service at N=3000 and N=10000, both shapes, both settings): %s: %s.\n",
			strings.Join(collectedParts, "; "), verdict(collectedParts, collectedMiss))
		fmt.Fprintf(&b, "- **Every event delivered within 2 s of the last 200** (the same rows): %s: %s.\n",
			strings.Join(deliveredParts, "; "), verdict(deliveredParts, deliveredMiss))
	}
	if sus != nil {
		v := "**met**"
		if sus.LagP99MS > 1000 || sus.Collected != sus.Committed {
			v = "**missed**"
		}
		fmt.Fprintf(&b, "- **Lag p99 under 1 s at the api's full rate** (sustained, %s, %.0f s): p99 %.0f ms, %.2f%% of the steps within 1 s, "+
			"%.0f steps collected/s against %.0f results committed/s: %s.\n",
			sus.Server, sus.LoadS, sus.LagP99MS, 100*sus.LagWithin1s, sus.CollectedPerS, sus.CommittedPerS, v)
	}
	if e2e != nil {
		b.WriteString(e2e.goals())
	}
	if dropin != nil {
		b.WriteString(dropin.goals())
	}
	if b.Len() == len("## Goals\n\n") {
		return "" // no goal measured (-only realstack)
	}
	b.WriteString("\n")
	return b.String()
}

// goalN are the fan-out sizes the goals are set at.
var goalN = map[int]bool{3000: true, 10000: true}

// afterString is a time after the last 200, or that it did not happen
// within the bench's wait.
func afterString(ms float64, ok bool) string {
	switch {
	case !ok:
		return "not within the wait"
	case ms == 0:
		return "0 ms"
	}
	return dur(ms)
}

func eventsString(received, distinct int) string {
	if received > distinct {
		return fmt.Sprintf("%d / %d (%d duplicates)", received, distinct, received-distinct)
	}
	return fmt.Sprintf("%d / %d", received, distinct)
}

// markdown is the sustained run's section.
func (s *sustainedResult) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Sustained load\n\nThe service (one api, one worker, sweeper off, the receiver above) at the api's full rate for %.0f s (%s): "+
		"%d steps of one enrollment each created beforehand (%.0f s at %.0f results/s, from %s, × %.1f), then %d webhook requests kept "+
		"in flight without pause%s. Every %v the bench reads the worker's `/metrics` (`stepcollect_steps_collected_total`, "+
		"`asynq_queue_size{queue=\"stepcollect\"}`, `stepcollect_collection_lag_seconds`), counts `stepcollect_outbox` and the receiver's "+
		"distinct events, through the load and until everything committed was collected and delivered. The lag of each interval is "+
		"the quantile of the histogram's *delta* since the previous look: exactly the steps collected in that interval, each timed by the "+
		"worker from the commit that released it to its deletion, at the histogram's bucket resolution (1 s is a bucket boundary, so "+
		"\"p99 under 1 s\" is exact). A step the worker never collects is not in the histogram, so the backlog "+
		"(200s − steps collected) is plotted beside it.\n\n",
		s.LoadS, s.Server, s.Steps, s.TargetS, s.Rate, s.RateFrom, stepMargin, s.Inflight,
		ifs(s.RanOut, fmt.Sprintf(" (**the pre-created steps ran out after %.1f s**)", s.LoadS)), sampleEvery)
	b.WriteString("![sustained load: throughput, collection lag and what waits, over time](sustained.png)\n\n")
	b.WriteString("| results committed | results/s | webhook p50 / p99 | steps collected/s | events delivered/s | lag p50 / p99 | " +
		"worst 250 ms p99 | max queue depth | max outbox pending | max uncollected | collected / delivered after the load | events received / distinct | errors |\n")
	b.WriteString("|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	fmt.Fprintf(&b, "| %d in %.1f s | %.0f | %s / %s | %.0f | %.0f | %.0f / %.0f ms | %.0f ms | %d tasks | %d events | %d steps | %s / %s | %s | %s |\n\n",
		s.Committed, s.LoadS, s.CommittedPerS, dur(s.P50MS), dur(s.P99MS), s.CollectedPerS, s.DeliveredPerS, s.LagP50MS, s.LagP99MS,
		s.MaxWindowP99, s.MaxQueueDepth, s.MaxOutbox, s.MaxBacklog,
		afterString(s.CollectedDrainMS, s.CollectedDrainMS != 0), afterString(s.DeliveredDrainMS, s.DeliveredDrainMS != 0),
		eventsString(s.EventsReceived, s.EventsDistinct), errString(s.Errors))
	b.WriteString("Rates are over the load: the 200s, the worker's count and the receiver's distinct events from its start to its end, " +
		"divided by its length; what was still waiting at the end is the time after it. The samples are in `raw.jsonl`.\n\n")
	return b.String()
}

// drainMarkdown is the worker-throughput section.
func drainMarkdown(ds []*drainResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "## Worker throughput\n\nHow fast workers drain a backlog: the api commits N=%d results of a step each (%s, "+
		"at most %d in flight) with **no worker running**, so its hand-off leaves the collect tasks on the queue and the events wait in the "+
		"outbox; then the worker processes start together (sweeper off, the receiver above). **steps collected/s** and "+
		"**events delivered/s** are the rates with every worker running, until 90%% of the backlog is done: from the moment every "+
		"worker answers `/readyz` (or 10%% is done, if later) to 90%% done, steps from `SELECT COUNT(*) FROM steps` every 20 ms "+
		"(interpolated), events from their arrival times at the receiver. Processes start tens to hundreds of ms apart on a busy "+
		"machine, and the first drains alone meanwhile: that part (**done before all ready**) is left out of the rate, as is the "+
		"tail; – when less than 100 ms was left to measure. **all collected** and **all delivered** are from every worker ready "+
		"to the steps table empty and to the last of the N distinct events. Each worker runs "+
		"with the default `-concurrency` (4 × CPUs).\n\n", ds[0].N, ds[0].Server, configPool(ds[0].Server))
	b.WriteString("| workers | api results/s (same run) | backlog: steps / collect tasks / events | start to all ready | done before all ready: steps / events | steps collected/s | all collected | events delivered/s | all delivered | events received / distinct |\n")
	b.WriteString("|--:|--:|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, d := range ds {
		rate := func(v float64, ok bool) string {
			if !ok {
				return "–"
			}
			return fmt.Sprintf("%.0f", v)
		}
		fmt.Fprintf(&b, "| %d | %.0f | %d / %d / %d | %s | %d / %d | %s | %s | %s | %s | %s |\n", d.Workers, d.APIPerS, d.StepRows, d.QueueDepth, d.OutboxRows,
			dur(d.StartMS), d.CollectedBeforeReady, d.DeliveredBeforeReady, rate(d.CollectedPerS, d.CollectedPerS != 0), afterString(d.CollectedMS, d.CollectedMS != 0),
			rate(d.DeliveredPerS, d.DeliveredPerS != 0), afterString(d.DeliveredMS, d.DeliveredMS != 0), eventsString(d.EventsReceived, d.EventsDistinct))
	}
	b.WriteString("\n")
	return b.String()
}

// mysqlPools names the pools of the MySQL settings.
func mysqlPools() string {
	var parts []string
	for _, c := range configs {
		// the clusters' settings are said in their own sentences
		if c.on != nil && c.Name != settingGalera && c.Name != settingGroup {
			parts = append(parts, fmt.Sprintf("%s %d", c.Name, c.Pool))
		}
	}
	return strings.Join(parts, ", ")
}

func configPool(name string) int {
	for _, c := range configs {
		if c.Name == name {
			return c.Pool
		}
	}
	return 0
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
	if len(sortedNs(results)) < 2 {
		// no fan-out rows (-only named other runs), or one N (-n 3000):
		// a line by N needs two, and a log axis of one value has no range
		return nil
	}
	for _, cfg := range configs {
		wall := func(r *fanout.Result, _ int) float64 { return r.WallMS }
		if err := nChart(idx, ns, cfg, fmt.Sprintf("One step to N enrollments, all reporting at once (%s)", cfg.Name),
			"wall time (ms)", filepath.Join(outDir, "fanout-"+chartName(cfg.Name)+".png"), wall); err != nil {
			return err
		}
		// flat means a design whose cost per result does not grow with N
		perResult := func(r *fanout.Result, n int) float64 { return r.WallMS / float64(n) }
		if err := nChart(idx, ns, cfg, fmt.Sprintf("Wall time per result, one step to N enrollments (%s)", cfg.Name),
			"ms per result (wall / N)", filepath.Join(outDir, "perresult-"+chartName(cfg.Name)+".png"), perResult); err != nil {
			return err
		}
	}
	return nil
}

// chartName is a setting's name as a file name: "MySQL stricter" is
// mysql-stricter.
func chartName(setting string) string {
	return strings.ToLower(strings.ReplaceAll(setting, " ", "-"))
}

// nChart draws one line per implementation of y(row, N) against N, both
// axes logarithmic, for the one-step rows of setting cfg. A setting with
// no rows (-settings named others) gets no chart: a log axis without a
// value has no range, and gonum panics drawing it.
func nChart(idx map[key]*fanout.Result, ns []int, cfg serverConfig, title, yLabel, file string, y func(*fanout.Result, int) float64) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "N (enrollments)"
	p.Y.Label.Text = yLabel
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	lines := 0
	for _, impl := range rowOrder {
		var pts plotter.XYs
		for _, n := range ns {
			if r := idx[key{impl, cfg.Name, n, false}]; r != nil && r.WallMS > 0 {
				pts = append(pts, plotter.XY{X: float64(n), Y: y(r, n)})
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
		lines++
	}
	if lines == 0 {
		return nil
	}
	return p.Save(9*vg.Inch, 5.5*vg.Inch, file)
}
