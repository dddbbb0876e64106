package main

import (
	"fmt"
	"os"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// The end-to-end section: NanoCMD v0.7.1's own server (cmd/nanocmd, its
// MySQL storage, a fake NanoMDM in the bench process) and stepcollect's api
// and worker, each given the inventory workflow's step (DeviceInformation
// and SecurityInfo) to the same N enrollments and then every result
// through NanoMDM v0.9.0's own webhook sender, on the same private
// mariadbd, one after the other.

const (
	e2eWorkflow     = "io.micromdm.wf.inventory.v1" // NanoCMD's inventory workflow
	e2eNanoCMD      = "NanoCMD v0.7.1"
	e2eStepcollect  = "stepcollect"
	e2eDropIn       = "stepcollect nanocmd"
	e2eBinary       = "nanocmd"             // in -bin, built by the Makefile's bench-build
	e2eDropInBinary = "stepcollect-nanocmd" // likewise: stepcollect's cmd/nanocmd
	e2eSchema       = "nanocmd-schema.sql"  // likewise: NanoCMD's MySQL schema, from its module
	e2eMDMKey       = "bench-nanomdm-key"
	e2eAPIKey       = "bench-nanocmd-key"
	e2eWait         = 2 * time.Minute // for every enrollment done, at most
)

// e2eResult is the section's measurement: both implementations, same run.
type e2eResult struct {
	Mode     string    `json:"mode"` // "e2e"
	Server   string    `json:"server"`
	N        int       `json:"n"`
	Inflight int       `json:"inflight"`
	Shared   bool      `json:"shared_server,omitempty"` // -server: the counters are not this run's alone
	Runs     []*e2eRun `json:"runs"`                    // NanoCMD, then stepcollect
}

// e2eRun is one implementation's run.
type e2eRun struct {
	Impl   string `json:"impl"`
	Server string `json:"server,omitempty"` // the database server's name
	// DB is the database server's process in CPU ("mariadbd", "mysqld").
	DB       string         `json:"db_process,omitempty"`
	Webhooks int            `json:"webhooks"` // sent
	OK       int            `json:"ok"`       // answered 200
	Errors   map[string]int `json:"errors"`
	// From the release of the first webhook: to every enrollment done (0:
	// not within the wait), to the last webhook answered, and to the end of
	// the window the CPU times and statement counts are taken over.
	DoneMS       float64 `json:"done_ms"`
	LastAnswerMS float64 `json:"last_answer_ms"`
	WindowMS     float64 `json:"window_ms"`
	Done         int     `json:"enrollments_done"`
	P50MS        float64 `json:"webhook_p50_ms"`
	P99MS        float64 `json:"webhook_p99_ms"`
	// CPU time of each process over the window, in ms; Service names the
	// processes that are the implementation (mariadbd is counted beside
	// them; the bench process is neither).
	CPU     map[string]float64 `json:"cpu_ms"`
	Service []string           `json:"service"`
	// Statements are the server's SHOW GLOBAL STATUS deltas over the
	// window (Com_*, Questions, Connections), the bench's own statements
	// (BenchStatements: the SHOW and the probes) taken out of Com_select
	// and Questions.
	Statements      map[string]float64 `json:"statements"`
	BenchStatements int                `json:"bench_statements"`
	Stranded        fanout.Stranded    `json:"stranded"`
	// How the step was started: NanoCMD's workflow start, stepcollect's
	// POST /v1/steps.
	Start string `json:"start"`
	// NanoCMD: what its NanoMDM saw. stepcollect: the receiver's events.
	MDM            *fakeMDMStats `json:"fake_nanomdm,omitempty"`
	EventsReceived int           `json:"events_received,omitempty"`
	EventsDistinct int           `json:"events_distinct,omitempty"`
	OutboxLeft     int           `json:"outbox_left,omitempty"`
	Profiles       []e2eProfile  `json:"profiles,omitempty"`
	ProfileNote    string        `json:"profile_note,omitempty"`
}

type e2eProfile struct {
	Process string `json:"process"`
	Path    string `json:"path"`
	Top     string `json:"top"`
}

// e2e runs the section: NanoCMD first, then stepcollect, at defaults.
func (r *runner) e2e(n, inflight int, outDir string) (*e2eResult, error) {
	res := &e2eResult{Mode: "e2e", Server: configs[0].Name, N: n, Inflight: inflight, Shared: r.serverPID == 0}
	nc, err := r.e2eNanoCMD(nanocmdOwn, r.ownTarget(configs[0]), n, inflight, "")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e2eNanoCMD, err)
	}
	res.Runs = append(res.Runs, nc)
	sc, err := r.e2eStepcollect(configs[0], n, inflight, outDir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e2eStepcollect, err)
	}
	res.Runs = append(res.Runs, sc)
	return res, nil
}

func (r *runner) e2eAnnounce(impl, server string, n int) {
	r.step++
	progress("[%d/%d] %-28s %-8s N=%-5d end to end, the inventory workflow's 2 commands …", r.step, max(r.total, r.step), impl, server, n)
}

func (r *runner) e2eDone(run *e2eRun) {
	done := "not every enrollment done within the wait"
	if run.DoneMS > 0 {
		done = "every enrollment done in " + dur(run.DoneMS)
	}
	fmt.Fprintf(os.Stderr, " %s, %d/%d webhooks 200, p50 %s p99 %s, %.2f ms CPU a webhook (service + %s)\n",
		done, run.OK, run.Webhooks, dur(run.P50MS), dur(run.P99MS), run.cpuPerWebhook(true, true), run.dbProc())
}
