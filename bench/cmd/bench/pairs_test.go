package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// pairRows is three alternated pairs at defaults N=3000 whose ratios are
// 3.0, 2.5 and 3.5, every service run clean but the one given.
func pairRows(t *testing.T, serviceWalls ...float64) []*fanout.Result {
	t.Helper()
	var out []*fanout.Result
	for i, w := range serviceWalls {
		floor := &fanout.Result{Config: fanout.Config{Impl: implFloor, Mode: fanout.ModeFanOut, N: 3000}, Server: "defaults", WallMS: 100, Pair: i + 1}
		svc := &fanout.Result{Config: fanout.Config{Impl: implService, Mode: fanout.ModeFanOut, N: 3000}, Server: "defaults", WallMS: w, Pair: i + 1,
			Completed: 3000, EventsReceived: 3000, EventsDistinct: 3000, CollectedAfterMS: 50, DeliveredAfterMS: 80, LagP99MS: 300,
			CPU: map[string]float64{procAPI: 300, procWorker: 150, procMySQLD: 600, procBench: 300}}
		out = append(out, floor, svc)
	}
	return out
}

func TestTheTablesShowTheMedianPair(t *testing.T) {
	rows := pairRows(t, 300, 250, 350)
	idx := index(rows)
	k := key{implService, "defaults", 3000, false}
	if got := idx[k]; got.Pair != 1 {
		t.Fatalf("the service row shown is pair %d's (%.0f ms), want pair 1's: its ratio 3.0 is the median of 3.0, 2.5, 3.5", got.Pair, got.WallMS)
	}
	if got := idx[key{implFloor, "defaults", 3000, false}]; got.Pair != 1 {
		t.Fatalf("the floor row shown is pair %d's, want the same pair as the service's (1)", got.Pair)
	}
	// of an even number, the higher of the middle two
	if got := index(pairRows(t, 250, 350))[k]; got.Pair != 2 {
		t.Fatalf("of ratios 2.5 and 3.5 the row shown is pair %d's, want pair 2's (3.5)", got.Pair)
	}
	md := pairsMarkdown(rows)
	bold := 0
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| defaults") && strings.Contains(line, "**") {
			bold++
		}
	}
	if !strings.Contains(md, "| defaults | 3000 | 1 | 100 ms | 300 ms | **3.00×** |") || bold != 1 {
		t.Fatalf("the pairs table does not bold pair 1's ratio alone:\n%s", md)
	}
	g := goals(rows, idx, nil, nil, nil, nil)
	if !strings.Contains(g, "N=3000 3.0× (the median of 3 alternated pairs: 3.00×, 2.50×, 3.50×): **met**") {
		t.Fatalf("the floor goal does not judge the median pair:\n%s", g)
	}
}

// A run that is not the median pair's still counts for the delivery goal.
func TestEveryPairCountsForTheDeliveryGoal(t *testing.T) {
	rows := pairRows(t, 300, 250, 350)
	rows[5].EventsDistinct = 2999 // pair 3's service: an event missing
	g := goals(rows, index(rows), nil, nil, nil, nil)
	if !strings.Contains(g, "**Every event delivered within 2 s of the last 200**") || !strings.Contains(g, "**missed** in 1 of 3") {
		t.Fatalf("pair 3's missing event does not miss the delivery goal:\n%s", g)
	}
}

// The pairs table shows each service run's CPU to done, its workers'
// together: the work a burst left for after its last 200 is still the
// fan-out's.
func TestThePairsTableShowsTheCPUToDone(t *testing.T) {
	rows := pairRows(t, 300, 250, 350)
	rows[1].CPUToDone = map[string]float64{procAPI: 300, procWorker: 300, procWorker + " 2": 150, procMySQLD: 900, procBench: 450}
	md := pairsMarkdown(rows)
	if !strings.Contains(md, "| 0.000 / 0.450 ms | 0.700 ms (0.100 / 0.150 / 0.300 / 0.150) |") {
		t.Fatalf("pair 1's CPU to done is not 0.700 ms a result (api 0.100, both workers 0.150, mysqld 0.300, bench 0.150):\n%s", md)
	}
	if strings.Count(md, "| – |") != 2 {
		t.Fatalf("the pairs without a CPU to done do not show a dash:\n%s", md)
	}
}

// A quick run of some settings (-settings defaults,stricter) charts those
// and skips the rest: drawing a setting without rows panicked in gonum
// ("Values must be greater than 0 for a log scale") after results.md.
func TestChartsSkipSettingsWithoutRows(t *testing.T) {
	var rows []*fanout.Result
	for _, n := range []int{3000, 10000} {
		rows = append(rows, &fanout.Result{Config: fanout.Config{Impl: implService, Mode: fanout.ModeFanOut, N: n}, Server: configs[0].Name, WallMS: float64(n) / 3})
	}
	dir := t.TempDir()
	if err := charts(rows, []int{3000, 10000}, dir); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range configs {
		_, err := os.Stat(filepath.Join(dir, "fanout-"+chartName(cfg.Name)+".png"))
		if cfg.Name == configs[0].Name && err != nil {
			t.Errorf("setting %s has rows and no chart: %v", cfg.Name, err)
		} else if cfg.Name != configs[0].Name && err == nil {
			t.Errorf("setting %s has no rows and a chart", cfg.Name)
		}
	}
}
