package main

import (
	"strings"
	"testing"
)

// A run that stopped with answers left uncompleted shows them as lost and
// when it last moved; a run that completed every enrollment shows its time.
func TestTheNanoHUBTableShowsResultsLostAndWhereARunStopped(t *testing.T) {
	res := &nanoHubResult{N: 500, MySQL: "9.7.4", Runs: []*nanoHubRun{
		{Server: "NanoHUB v0.2.0", Setting: "READ COMMITTED, lock wait 2 s", Enrolled: 500, StepIDs: 500, Answered: 500, Completed: 409,
			ProgressMS: 4200, CPU: map[string]float64{"nanohub": 1000, "mysqld": 2000}, LockWaits: 91},
		{Server: "stepcollect `nanohub`", Setting: "READ COMMITTED, lock wait 2 s", Enrolled: 500, StepIDs: 500, Answered: 500, Completed: 500,
			DoneMS: 1500, ProgressMS: 1500, CPU: map[string]float64{"nanohub": 500}},
	}}
	md := res.markdown()
	for _, want := range []string{
		"| NanoHUB v0.2.0 | READ COMMITTED, lock wait 2 s | 500 | 500 | 409 | **91** | not done (stopped at 4200 ms) | 2.00 | 4.00 | 91 / 0 |",
		"| stepcollect `nanohub` | READ COMMITTED, lock wait 2 s | 500 | 500 | 500 | **0** | 1500 ms | 1.00 | – | 0 / 0 |",
		"-only nanohub -nanohub-n 500",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("the table lacks %q:\n%s", want, md)
		}
	}
}
