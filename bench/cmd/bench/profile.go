package main

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// profiled is the service at N=3000 (stricter) once more, with the api's
// CPU profile: where a result's time goes.
type profiled struct {
	res *fanout.Result
	top string
}

func (r *runner) profile(outDir string) *profiled {
	path, _ := filepath.Abs(filepath.Join(outDir, "api.cpu.pprof"))
	res, err := r.serviceProfiled(configs[1], 3000, false, path)
	if err != nil {
		die("profiled run: %v", err)
	}
	out, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=30", filepath.Join(r.bin, "api"), path).CombinedOutput()
	if err != nil {
		die("go tool pprof: %v\n%s", err, out)
	}
	return &profiled{res: res, top: string(out)}
}

func (p *profiled) markdown() string {
	var b strings.Builder
	r := p.res
	fmt.Fprintf(&b, "## Where the service's time goes\n\nThe service at N=3000 (stricter), once more, with CPU time per process "+
		"during the %s the results took, on %d CPUs (%s of CPU time available):\n\n", dur(r.WallMS), runtime.NumCPU(), dur(r.WallMS*float64(runtime.NumCPU())))
	b.WriteString("| process | CPU time | share of the available |\n|---|--:|--:|\n")
	var names []string
	total := 0.0
	for n, v := range r.CPU {
		names = append(names, n)
		total += v
	}
	sort.Slice(names, func(i, j int) bool { return r.CPU[names[i]] > r.CPU[names[j]] })
	for _, n := range names {
		fmt.Fprintf(&b, "| %s | %s | %.0f%% |\n", n, dur(r.CPU[n]), 100*r.CPU[n]/(r.WallMS*float64(runtime.NumCPU())))
	}
	fmt.Fprintf(&b, "| all | %s | %.0f%% |\n\n", dur(total), 100*total/(r.WallMS*float64(runtime.NumCPU())))
	b.WriteString("The api's CPU profile (`go tool pprof -top -cum`, time by function including what it calls), from `api.cpu.pprof`:\n\n```\n")
	b.WriteString(strings.TrimSpace(p.top))
	b.WriteString("\n```\n\n")
	return b.String()
}
