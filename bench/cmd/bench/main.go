// Command bench measures stepcollect side by side with NanoCMD v0.7.0 and
// v0.7.1 in one run on one server, against the physical floor (one durable
// commit per result), and writes docs/bench/results.md and its charts.
//
// Every implementation is its own binary (see the Makefile's bench target:
// one Go build can hold only one version of NanoCMD), every measurement
// gets a fresh migrated database, and every pool is warmed a few
// connections at a time before the clock starts.
//
// The service rows run the real api and worker with a callback receiver in
// the bench process (the tests' own, internal/testkit), and time collection and delivery after
// the last webhook 200. Beside them: a sustained run at the api's full
// rate, sampled over time (-sustained, sustained.go), and how fast 1 or
// more worker processes drain a backlog committed while none ran
// (-workers, drain.go). And end to end against NanoCMD v0.7.1's own
// server, each given the same step and the same results through NanoMDM's
// webhook sender (-e2e-n, e2e.go); and the inventory workflow through
// NanoMDM's own server to simulated Macs (-realstack-n, realstack.go); and
// NanoHUB v0.2.0 beside stepcollect's nanohub, on MySQL (-nanohub-n,
// nanohub.go).
package main

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/internal/testkit/testha"
)

// serverConfig is one server setting, applied per session through the DSN.
// on is the server it runs on: nil for the benchmark's own (the private
// mariadbd or -server), else the one -mysql-dsn names.
type serverConfig struct {
	Name   string
	Pool   int
	params map[string]string
	on     *dbServer
	// stepcollectOnly: the floor and stepcollect's rows, not NanoCMD's
	// (the Galera setting: what the consensus costs stepcollect)
	stepcollectOnly bool
}

// runs reports whether the row label runs in setting c.
func (c serverConfig) runs(label string) bool {
	return !c.stepcollectOnly || !strings.HasPrefix(label, "NanoCMD")
}

// dbServer is a server other than the benchmark's own that rows run on.
type dbServer struct {
	dsn     string // root, no database
	admin   *sql.DB
	version string
	logBin  bool
}

// binlogOn reports whether the server writes a binary log.
func binlogOn(admin *sql.DB) (bool, error) {
	var on int
	err := admin.QueryRow("SELECT @@log_bin").Scan(&on)
	return on == 1, err
}

// mysqlConfigs are configs on MySQL (-mysql-dsn): MySQL 8.0 removed
// tx_isolation for transaction_isolation (MariaDB 10.11 knows only the
// first), and a pool is kept under the server's max_connections.
func mysqlConfigs(on *dbServer, maxConns int) []serverConfig {
	var out []serverConfig
	for _, c := range configs {
		m := serverConfig{Name: "MySQL " + c.Name, Pool: min(c.Pool, maxConns-100), on: on, params: map[string]string{}}
		for k, v := range c.params {
			if k == "tx_isolation" {
				k = "transaction_isolation"
			}
			m.params[k] = v
		}
		out = append(out, m)
	}
	return out
}

// serverOf is the admin pool and the root DSN of cfg's server.
func (r *runner) serverOf(cfg serverConfig) (*sql.DB, string) {
	if cfg.on != nil {
		return cfg.on.admin, cfg.on.dsn
	}
	return r.admin, r.server
}

// The server runs with the binary log on and sync_binlog=1; defaults and
// stricter keep their transactions out of it (sql_log_bin=0, per session),
// binlog writes every one to it, as a server that replicas (and so any
// failover) follow must.
var configs = []serverConfig{
	{Name: "defaults", Pool: 128, params: map[string]string{"sql_log_bin": "0"}},
	{Name: "stricter", Pool: 1000, params: map[string]string{
		"tx_isolation": "'READ-COMMITTED'", "innodb_lock_wait_timeout": "1", "sql_log_bin": "0"}},
	{Name: settingBinlog, Pool: 128},
}

// settingBinlog is the setting with the binary log in use.
const settingBinlog = "binlog"

// withoutBinlog drops the binlog setting, for a server whose binary log is
// off (a -server without one): its rows would be the defaults' again.
func withoutBinlog(cs []serverConfig) []serverConfig {
	var out []serverConfig
	for _, c := range cs {
		if c.Name != settingBinlog {
			out = append(out, c)
		}
	}
	return out
}

// storageImpl is one storage-level implementation: a binary and the DSN
// parameters it runs with.
type storageImpl struct {
	Label  string
	Binary string
	params map[string]string
}

var storageImpls = []storageImpl{
	{"NanoCMD v0.7.0", "fanout-nanocmd-v0.7.0", nil},
	{"NanoCMD v0.7.1", "fanout-nanocmd-v0.7.1", nil},
	{"stepcollect storage", "fanout-stepcollect", map[string]string{"interpolateParams": "true"}},
}

// Row labels that are not storage binaries.
const (
	implFloor   = "floor: single-row UPDATEs"
	implService = "stepcollect service (HTTP)"
)

type runner struct {
	timeline  string // -timeline's file, or empty
	bin       string
	serverPID int
	server    string
	version   string    // the server's SELECT VERSION()
	mysqlSrv  *dbServer // -mysql-dsn's, or nil
	galera    *dbServer // -galera's node 0, or nil
	group     *dbServer // -group-replication's primary, or nil
	admin     *sql.DB
	results   []*fanout.Result
	raw       *os.File
	step      int
	total     int
}

func main() {
	o := parseFlags()
	if err := os.MkdirAll(o.outDir, 0o755); err != nil {
		die("%v", err)
	}
	r := startRunner(o)
	// the private mariadbd too: without it every run left one behind
	// (43 after a loop of runs, each a 512 MiB buffer pool and its threads,
	// which slowed every run after)
	defer runAtExit()
	defer r.raw.Close()
	r.total = o.measurements()
	started := time.Now()
	r.runFanOut(o)
	r.runUncontended(o)
	side := r.runSideRuns(o)
	r.writeReport(o, side, started)
}

// startRunner opens the server (a private mariadbd unless -server names
// one) and raw.jsonl.
func startRunner(o *options) *runner {
	r := &runner{bin: o.binDir, server: o.server, serverPID: o.serverPID, timeline: o.timeline}
	if r.server == "" {
		progress("starting a private mariadbd (max_connections 2000, binary log on, sync_binlog=1)")
		srv, err := testha.RunMariaDB(testha.MariaDBConfig{
			MaxConnections: 2000, BufferPool: "512M", LogBin: true,
			// one durable commit per result is the floor measured
			Durable: true,
			// the shared server's character set, which the bench's
			// server read from my.cnf before it read none
			Args: []string{"--back-log=4096", "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci"},
		})
		if err != nil {
			die("%v", err)
		}
		atExit(srv.Stop)
		r.server, r.serverPID = srv.DSN(), srv.PID()
	}
	var err error
	if r.admin, err = sql.Open("mysql", r.server); err != nil {
		die("%v", err)
	}
	if err := r.admin.QueryRow("SELECT VERSION()").Scan(&r.version); err != nil {
		die("server: %v", err)
	}
	r.addServerConfigs(o)
	if o.galera {
		r.addGalera()
	}
	if o.group {
		r.addGroup()
	}
	if r.raw, err = os.Create(filepath.Join(o.outDir, "raw.jsonl")); err != nil {
		die("%v", err)
	}
	return r
}

// addServerConfigs drops the binlog setting where the server writes no
// binary log, and adds the MySQL settings of -mysql-dsn.
func (r *runner) addServerConfigs(o *options) {
	if logBin, err := binlogOn(r.admin); err != nil {
		die("server: %v", err)
	} else if !logBin {
		progress("the server's binary log is off: no %s rows", settingBinlog)
		configs = withoutBinlog(configs)
	}
	if o.mysqlDSN == "" {
		return
	}
	var err error
	if r.mysqlSrv, err = openMySQL(o.mysqlDSN); err != nil {
		die("-mysql-dsn: %v (BENCH_MYSQL_DSN= skips the MySQL rows)", err)
	}
	var maxConns int
	if err := r.mysqlSrv.admin.QueryRow("SELECT @@max_connections").Scan(&maxConns); err != nil {
		die("-mysql-dsn: %v", err)
	}
	my := mysqlConfigs(r.mysqlSrv, maxConns)
	if !r.mysqlSrv.logBin {
		progress("MySQL's binary log is off: no MySQL %s rows", settingBinlog)
		my = withoutBinlog(my)
	}
	configs = append(configs, my...)
}

// addGalera starts a private three-node Galera cluster of the machine's
// mariadbd (each node as the bench's own server: 2000 connections, 512
// MiB, durable commits; no binary log, which Galera does not need) and adds
// its setting: the defaults, on node 0, where the api and the worker
// write and the other two nodes certify and apply every transaction.
func (r *runner) addGalera() {
	progress("starting a private three-node Galera cluster")
	g, err := testha.RunGalera(3, testha.MariaDBConfig{MaxConnections: 2000, BufferPool: "512M", Durable: true,
		Args: []string{"--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci", "--back-log=4096"}})
	if err != nil {
		die("-galera: %v", err)
	}
	atExit(g.Stop)
	srv, err := openMySQL(g.Nodes[0].DSN())
	if err != nil {
		die("-galera: %v", err)
	}
	r.galera = srv
	configs = append(configs, serverConfig{Name: settingGalera, Pool: 128, on: srv, stepcollectOnly: true})
}

// settingGalera is the setting on the Galera cluster.
const settingGalera = "Galera defaults"

// addGroup starts a private three-member MySQL Group Replication group
// (single primary, MySQL's defaults otherwise: binary log on,
// sync_binlog=1; each member 2000 connections, 512 MiB, durable commits)
// and adds its setting: every row's clients on the primary, member 0,
// whose every commit waits for the group's consensus, and which the two
// other members apply.
func (r *runner) addGroup() {
	progress("starting a private three-member Group Replication group")
	g, err := testha.RunGroupReplication(3, "--max-connections=2000", "--innodb-buffer-pool-size=512M",
		"--innodb-redo-log-capacity=512M", "--back-log=4096")
	if err != nil {
		die("-group-replication: %v", err)
	}
	atExit(g.Stop)
	srv, err := openMySQL(g.Members[0].DSN())
	if err != nil {
		die("-group-replication: %v", err)
	}
	r.group = srv
	configs = append(configs, serverConfig{Name: settingGroup, Pool: 128, on: srv, stepcollectOnly: true})
}

// settingGroup is the setting on the Group Replication group.
const settingGroup = "Group Replication defaults"

// runFanOut measures the rows of the fan-out tables: each server setting,
// N and shape, the floor, each storage and the service.
func (r *runner) runFanOut(o *options) {
	for _, name := range strings.Split(o.settings, ",") {
		if name != "" && !slices.ContainsFunc(configs, func(c serverConfig) bool { return c.Name == name }) {
			die("-settings: no setting %q in this run", name)
		}
	}
	for _, cfg := range configs {
		if !o.inSettings(cfg.Name) {
			continue
		}
		for _, n := range o.ns {
			for _, control := range o.controls {
				pair := ifn(o.pairsAt(cfg, n, control), 1, 0)
				if o.want(implFloor) {
					r.recordPaired(pair)(r.floor(cfg, n, control))
				}
				for _, im := range storageImpls {
					if o.runsAt(im.Label, n) && cfg.runs(im.Label) {
						r.record(r.storage(im, fanout.ModeFanOut, cfg, n, control, 1))
					}
				}
				if o.want(implService) {
					r.recordPaired(pair)(r.service(cfg, n, control))
				}
				// the rest of the pairs alternate, so that a machine whose
				// speed drifts over minutes (this VM's CPU time a result
				// moves by a quarter between runs minutes apart) weighs on
				// both sides alike
				for k := 2; pair > 0 && k <= o.pairs; k++ {
					r.recordPaired(k)(r.floor(cfg, n, control))
					r.recordPaired(k)(r.service(cfg, n, control))
				}
			}
		}
	}
}

// runUncontended measures each storage's uncontended path, 1 and 4
// commands a step.
func (r *runner) runUncontended(o *options) {
	for _, im := range storageImpls {
		if !o.want(im.Label) {
			continue
		}
		for _, k := range []int{1, 4} {
			r.record(r.storage(im, fanout.ModeUncontended, configs[0], 50, false, k))
		}
	}
}

// sideRuns are the measurements beside the fan-out tables; nil where one
// did not run.
type sideRuns struct {
	sus    *sustainedResult
	drains []*drainResult
	e2e    *e2eResult
	dropin *dropInResult
	real   *realStackResult
	hub    *nanoHubResult
	large  *largeTable
	prof   *profiled
}

func (r *runner) runSideRuns(o *options) sideRuns {
	var s sideRuns
	var err error
	if o.runSustained() {
		if s.sus, err = r.sustained(o.sideCfg, o.susFor, o.outDir); err != nil {
			die("sustained: %v", err)
		}
		r.recordJSON(s.sus)
	}
	for _, k := range o.workerCounts {
		d, err := r.drain(o.sideCfg, o.workersN, k)
		if err != nil {
			die("worker throughput: %v", err)
		}
		s.drains = append(s.drains, d)
		r.recordJSON(d)
	}
	if o.runE2E() {
		if s.e2e, err = r.e2e(o.e2eN, o.e2eInflight, o.outDir); err != nil {
			die("end to end: %v", err)
		}
		r.recordJSON(s.e2e)
	}
	if o.runDropIn() {
		if s.dropin, err = r.dropIn(o.e2eN, o.e2eInflight, o.outDir); err != nil {
			die("drop-in: %v", err)
		}
		r.recordJSON(s.dropin)
	}
	if o.runRealStack() {
		if s.real, err = r.realStack(o.realStackN, o.realStackBefore); err != nil {
			die("real stack: %v", err)
		}
		r.recordJSON(s.real)
	}
	if o.runNanoHub() {
		if s.hub, err = r.nanoHub(o.nanoHubN); err != nil {
			die("nanohub: %v", err)
		}
		r.recordJSON(s.hub)
	}
	if !o.skipBig {
		s.large = r.largeTable(o.want)
	}
	if !o.noProf && o.want(implService) {
		s.prof = r.profile(o.outDir)
	}
	return s
}

// writeReport writes results.md and the charts, and prints the report.
func (r *runner) writeReport(o *options, s sideRuns, started time.Time) {
	md := report(r.results, s, r.version, r.mysqlSrv, r.galera, r.group, started, time.Since(started))
	if err := os.WriteFile(filepath.Join(o.outDir, "results.md"), []byte(md), 0o644); err != nil {
		die("%v", err)
	}
	if err := charts(r.results, o.ns, o.outDir); err != nil {
		die("charts: %v", err)
	}
	fmt.Print(md)
	progress("done in %v; wrote %s", time.Since(started).Round(time.Second), filepath.Join(o.outDir, "results.md"))
	runAtExit()
}

// openMySQL opens the -mysql-dsn server and describes it.
func openMySQL(dsn string) (*dbServer, error) {
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	srv := &dbServer{dsn: dsn, admin: admin}
	var logBin, syncBinlog int
	if err := admin.QueryRow("SELECT VERSION(), @@log_bin, @@sync_binlog").Scan(&srv.version, &logBin, &syncBinlog); err != nil {
		return nil, err
	}
	srv.logBin = logBin == 1
	srv.version += ifs(srv.logBin, fmt.Sprintf(", binary log on, sync_binlog=%d", syncBinlog)) + ifs(!srv.logBin, ", binary log off")
	return srv, nil
}

func (r *runner) record(res *fanout.Result, err error) {
	r.recordPaired(0)(res, err)
}

// recordPaired is record of a row of alternated pair k (0: not paired).
func (r *runner) recordPaired(k int) func(*fanout.Result, error) {
	return func(res *fanout.Result, err error) {
		if err != nil {
			die("%v", err)
		}
		res.Pair = k
		r.results = append(r.results, res)
		b, _ := json.Marshal(res)
		r.raw.Write(append(b, '\n'))
	}
}

// recordJSON writes a measurement that is not a fanout.Result to raw.jsonl.
func (r *runner) recordJSON(v any) {
	b, _ := json.Marshal(v)
	r.raw.Write(append(b, '\n'))
}

func (r *runner) announce(label string, cfg serverConfig, n int, control bool, mode string) {
	r.step++
	shape := "one step"
	if control {
		shape = "control: a step each"
	}
	if mode != fanout.ModeFanOut {
		shape = mode
	}
	if mode == fanout.ModeUncontended {
		cfg.Name = fmt.Sprintf("%d cmd", n)
		n = 50
	}
	progress("[%d/%d] %-28s %-8s N=%-5d %s …", r.step, max(r.total, r.step), label, cfg.Name, n, shape)
}

// storage runs one storage-level measurement through an implementation's
// binary on a fresh database.
func (r *runner) storage(im storageImpl, mode string, cfg serverConfig, n int, control bool, commands int) (*fanout.Result, error) {
	if mode == fanout.ModeUncontended {
		r.announce(im.Label, cfg, commands, control, mode)
	} else {
		r.announce(im.Label, cfg, n, control, mode)
	}
	admin, server := r.serverOf(cfg)
	dsn, drop, err := freshDatabase(admin, server, merge(cfg.params, im.params))
	if err != nil {
		return nil, err
	}
	defer drop()
	r.settle()
	res, err := runBinary(filepath.Join(r.bin, im.Binary), im.Label, mode, dsn, n, cfg.Pool, control, commands)
	if err != nil {
		return nil, err
	}
	res.Server = cfg.Name
	done(res)
	return res, nil
}

func runBinary(bin, label, mode, dsn string, n, pool int, control bool, commands int) (*fanout.Result, error) {
	cmd := exec.Command(bin, "-label", label, "-mode", mode, "-dsn", dsn, "-n", strconv.Itoa(n),
		"-pool", strconv.Itoa(pool), "-control="+strconv.FormatBool(control), "-commands", strconv.Itoa(commands))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", filepath.Base(bin), err, stderr.String())
	}
	var res fanout.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("%s output %q: %v", bin, stdout.String(), err)
	}
	return &res, nil
}

func done(res *fanout.Result) {
	extra := ""
	if res.LagP99MS > 0 {
		extra = fmt.Sprintf(", lag p99 %.0f ms", res.LagP99MS)
	}
	if res.Impl == implService {
		extra += fmt.Sprintf(", collected %s and delivered %s after the last 200, %d/%d events",
			afterString(res.CollectedAfterMS, res.Stranded.Steps == 0), afterString(res.DeliveredAfterMS, res.EventsDistinct >= res.N),
			res.EventsReceived, res.EventsDistinct)
	}
	fmt.Fprintf(os.Stderr, " %.0f ms, %d errors%s\n", res.WallMS, sum(res.Errors), extra)
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

func sum(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}

func progress(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format, append([]any{time.Now().Format("15:04:05")}, a...)...)
	if !strings.HasSuffix(format, "…") {
		fmt.Fprintln(os.Stderr)
	}
}

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", a...)
	runAtExit()
	os.Exit(1)
}

var (
	exitMu    sync.Mutex
	exitFuncs []func()
)

// atExit has f run when the bench ends, by die, by an interrupt or at the
// end of main: the private mariadbd runs in a process group of its own, so
// no Ctrl-C reaches it, and os.Exit runs no deferred call.
func atExit(f func()) {
	exitMu.Lock()
	defer exitMu.Unlock()
	if exitFuncs == nil {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() { die("%v", <-sig) }()
	}
	exitFuncs = append(exitFuncs, f)
}

// runAtExit runs what atExit was given, last first, once.
func runAtExit() {
	exitMu.Lock()
	fs := exitFuncs
	exitFuncs = nil
	exitMu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}
