package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// options are the command line, checked.
type options struct {
	binDir, outDir, server, only string
	serverPID                    int    // -server-pid: -server's process, when it runs here
	settings                     string // the fan-out rows' server settings, comma-separated; empty: all
	ns                           []int
	controls                     []bool // the fan-out shapes: false one step to N, true a step each
	skipBig, noProf              bool
	nanoMax                      int
	susFor                       time.Duration
	sideCfg                      serverConfig // of the sustained and worker-throughput runs
	workerCounts                 []int
	workersN                     int
	e2eN, e2eInflight            int
	realStackN                   int    // -realstack-n: devices of the real-stack rows (0 skips them)
	realStackBefore              string // -realstack-before: an older stepcollect nanocmd to run them with too
	nanoHubN                     int    // -nanohub-n: devices of the NanoHUB rows (0 skips them)
	mysqlDSN                     string // -mysql-dsn: the fan-out rows on MySQL too
	galera                       bool   // -galera: stepcollect's fan-out rows on a three-node Galera cluster too
	group                        bool   // -group-replication: and on a three-member MySQL Group Replication group
	pairs                        int    // -pairs: alternated floor and service runs where the goal compares them
	timeline                     string // -timeline: where each service burst's CPU and answers over time are appended
}

// want reports whether -only asks for the row (or run) label.
func (o *options) want(label string) bool {
	return o.only == "" || strings.Contains(","+o.only+",", ","+label+",")
}

// inSettings reports whether the fan-out rows run in server setting name
// (-settings).
func (o *options) inSettings(name string) bool {
	return o.settings == "" || strings.Contains(","+o.settings+",", ","+name+",")
}

// runsAt reports whether the row label runs at fan-out n.
func (o *options) runsAt(label string, n int) bool {
	return o.want(label) && (n <= o.nanoMax || !strings.HasPrefix(label, "NanoCMD"))
}

// pairsSettings are the settings whose floor and service the goal "the
// service within 3x the floor" compares (docs/benchmarks.md).
var pairsSettings = map[string]bool{"defaults": true, "stricter": true}

// pairsAt reports whether the floor and the service run as -pairs
// alternated pairs at (cfg, n, shape): the goal's settings and fan-out
// sizes, one step to N, with both rows asked for.
func (o *options) pairsAt(cfg serverConfig, n int, control bool) bool {
	return o.pairs > 1 && pairsSettings[cfg.Name] && goalN[n] && !control && o.want(implFloor) && o.want(implService)
}

func (o *options) runSustained() bool {
	return o.susFor > 0 && (o.want(implService) || o.want("sustained"))
}

func (o *options) runE2E() bool { return o.e2eN > 0 && o.want("e2e") }

func (o *options) runDropIn() bool { return o.e2eN > 0 && o.want("dropin") }

func (o *options) runRealStack() bool { return o.realStackN > 0 && o.want("realstack") }

// runNanoHub: both NanoHUB binaries need MySQL (NanoMDM's storage does not
// run on MariaDB).
func (o *options) runNanoHub() bool { return o.nanoHubN > 0 && o.want("nanohub") && o.mysqlDSN != "" }

// measurements counts what the run will measure, for the progress lines'
// [k/total].
func (o *options) measurements() int {
	labels := []string{implFloor}
	for _, im := range storageImpls {
		labels = append(labels, im.Label)
	}
	labels = append(labels, implService)
	total := 0
	for _, l := range labels {
		for _, n := range o.ns {
			for _, cfg := range configs {
				if o.runsAt(l, n) && cfg.runs(l) && o.inSettings(cfg.Name) {
					total += len(o.controls)
				}
			}
		}
	}
	for _, n := range o.ns {
		for _, cfg := range configs {
			for _, control := range o.controls {
				if o.inSettings(cfg.Name) && o.pairsAt(cfg, n, control) {
					total += 2 * (o.pairs - 1)
				}
			}
		}
	}
	for _, im := range storageImpls {
		if o.want(im.Label) {
			total += 2 // the uncontended path, 1 and 4 commands
		}
	}
	if o.runSustained() {
		total++
	}
	total += len(o.workerCounts)
	if o.runE2E() {
		total += 2
	}
	if o.runDropIn() {
		total += 2 * ifn(o.mysqlDSN != "", 2, 1)
	}
	if o.runRealStack() {
		total += ifn(o.realStackBefore != "", 3, 2)
	}
	if o.runNanoHub() {
		total += len(nanoHubServers) * len(nanoHubSettings)
	}
	return total
}

func parseFlags() *options {
	var (
		o       options
		nsFlag  = flag.String("n", "25,100,300,3000,10000", "comma-separated fan-out sizes")
		shapes  = flag.String("shapes", "one,each", "fan-out shapes: one (one step to N) and/or each (a step each, the control)")
		susCfg  = flag.String("sustained-server", "defaults", "server setting of the sustained and worker-throughput runs: defaults or stricter")
		wFlag   = flag.String("workers", "1,3", "comma-separated worker process counts for the worker-throughput table (empty or 0 skips it)")
		flagErr error
	)
	flag.StringVar(&o.binDir, "bin", "bin/bench", "directory of the fanout-* binaries and of api and worker")
	flag.StringVar(&o.outDir, "out", "docs/bench", "where results.md, the charts and raw.jsonl go")
	flag.StringVar(&o.server, "server", "", "use this server DSN (root, no database) instead of a private mariadbd; needs max_connections above 1000")
	flag.IntVar(&o.serverPID, "server-pid", 0, "with -server on this machine: its process id, whose CPU the rows then record as mysqld's")
	flag.BoolVar(&o.skipBig, "skip-large-table", false, "skip the 1M-row CancelSteps and sweeper measurements")
	flag.BoolVar(&o.noProf, "skip-profile", false, "skip the profiled service run")
	flag.StringVar(&o.settings, "settings", "", "comma-separated server settings the fan-out rows run in (default all): defaults, stricter, binlog, and the MySQL, Galera and Group Replication ones where those run; to pair one row of one setting quickly")
	flag.StringVar(&o.only, "only", "", "comma-separated row labels to run (default all); \"sustained\", \"workers\", \"e2e\", \"dropin\", \"realstack\" and \"nanohub\" name those runs alone")
	flag.IntVar(&o.nanoMax, "nanocmd-max-n", 10000, "largest N NanoCMD's storage rows run at (above it they take minutes: N=100000 is about 7 minutes for v0.7.1)")
	flag.DurationVar(&o.susFor, "sustained", 60*time.Second, "length of the sustained run at the api's full rate (0 skips it)")
	flag.IntVar(&o.workersN, "workers-n", 10000, "results committed with the workers stopped, for the worker-throughput table")
	// seven, not three: one build's ratio spread from 2.67x to 3.52x over
	// 13 pairs at defaults N=3000 (docs/bench/pairs-2026-12-05b), so the
	// median of three moved by more than any change it was to judge; four
	// more pairs of each of four cells cost about two minutes on 2 CPUs
	flag.IntVar(&o.pairs, "pairs", 7, "at N=3000 and 10000, one step, defaults and stricter: run the floor and the service this many times, alternated; the tables show the pair whose ratio is the median (1: once)")
	flag.StringVar(&o.timeline, "timeline", "", "append every measured service burst's timeline to this file: every 50 ms, the webhooks answered and each process's CPU since the release (tab-separated, a # line per burst)")
	flag.IntVar(&o.e2eN, "e2e-n", 3000, "enrollments of the end-to-end runs against NanoCMD v0.7.1's own server (0 skips them; -only e2e or -only dropin runs one alone)")
	flag.IntVar(&o.realStackN, "realstack-n", 500, "devices of the real-stack rows: NanoMDM v0.9.0's own server, that many simulated Macs, one inventory workflow start through stepcollect's nanocmd and NanoCMD v0.7.1's (0 skips them; -only realstack runs them alone)")
	flag.StringVar(&o.realStackBefore, "realstack-before", "", "a stepcollect nanocmd binary built from an older commit, to run the real-stack row with too (as \"before\")")
	flag.IntVar(&o.nanoHubN, "nanohub-n", 500, "devices of the NanoHUB rows (with -mysql-dsn): NanoHUB v0.2.0's own binary and stepcollect's nanohub, each at MySQL's defaults and at READ COMMITTED with a 2 s lock wait, one workflow start for that many simulated Macs (0 skips them; -only nanohub runs them alone)")
	flag.IntVar(&o.e2eInflight, "e2e-inflight", 64, "enrollments answering at once in the end-to-end run (each answers its commands one after another)")
	flag.StringVar(&o.mysqlDSN, "mysql-dsn", "", "also run the fan-out rows (floor, NanoCMD, storage, service) on this MySQL server (root DSN, no database), as settings \"MySQL defaults\", \"MySQL stricter\" and \"MySQL binlog\"")
	flag.BoolVar(&o.group, "group-replication", false, "also run the floor and stepcollect's fan-out rows on a private three-member MySQL Group Replication group (scripts/mysql.sh's chroot), as setting \"Group Replication defaults\": what the consensus costs per result")
	flag.BoolVar(&o.galera, "galera", false, "also run the floor and stepcollect's fan-out rows on a private three-node MariaDB Galera cluster (galera-4), as setting \"Galera defaults\": what the consensus costs per result")
	flag.Parse()

	if o.ns, flagErr = parseInts(*nsFlag); flagErr != nil {
		die("-n: %v", flagErr)
	}
	if *wFlag != "" && *wFlag != "0" {
		if o.workerCounts, flagErr = parseInts(*wFlag); flagErr != nil {
			die("-workers: %v", flagErr)
		}
	}
	if o.workersN < 1 {
		die("-workers-n: %d is not a positive count", o.workersN)
	}
	if o.realStackN < 0 {
		die("-realstack-n %d: want a count (0 skips)", o.realStackN)
	}
	if o.nanoHubN < 0 {
		die("-nanohub-n %d: want a count (0 skips)", o.nanoHubN)
	}
	if o.only != "" && o.want("nanohub") && o.nanoHubN > 0 && o.mysqlDSN == "" {
		die("-only nanohub: the NanoHUB rows need -mysql-dsn (NanoMDM's MySQL storage does not run on MariaDB)")
	}
	if o.e2eN < 0 || o.e2eInflight < 1 {
		die("-e2e-n %d, -e2e-inflight %d: want a count (0 skips) and a positive count", o.e2eN, o.e2eInflight)
	}
	found := false
	for _, c := range configs {
		if c.Name == *susCfg {
			o.sideCfg, found = c, true
		}
	}
	if !found {
		die("-sustained-server: %q is neither defaults nor stricter", *susCfg)
	}
	for _, sh := range strings.Split(*shapes, ",") {
		switch strings.TrimSpace(sh) {
		case "one":
			o.controls = append(o.controls, false)
		case "each":
			o.controls = append(o.controls, true)
		default:
			die("-shapes: %q is not one or each", sh)
		}
	}
	if !o.want(implService) && !o.want("workers") {
		o.workerCounts = nil
	}
	return &o
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive count", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func ifn(c bool, a, b int) int {
	if c {
		return a
	}
	return b
}
