package main

import (
	"database/sql"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// The drop-in section: NanoCMD v0.7.1's own server and stepcollect's
// cmd/nanocmd in its place, with the same command line, on the same work
// (the inventory workflow started for N enrollments, every result through
// NanoMDM's webhook sender) and the same done (every enrollment's values
// in the inventory route), on each server: the private mariadbd and the
// MySQL of -mysql-dsn.

// dbTarget is a database server a run makes its database on.
type dbTarget struct {
	Name   string // "MariaDB", "MySQL"
	admin  *sql.DB
	dsn    string // root, no database
	params map[string]string
	pid    int    // its process, for its CPU; 0: not measured
	proc   string // its process's name in the run's CPU
}

// ownTarget is the bench's own server (the private mariadbd or -server)
// with cfg's parameters.
func (r *runner) ownTarget(cfg serverConfig) dbTarget {
	return dbTarget{Name: "MariaDB", admin: r.admin, dsn: r.server, params: cfg.params, pid: r.serverPID, proc: "mariadbd"}
}

// mysqlTarget is the -mysql-dsn server with cfg's parameters; its mysqld
// is found by the port it was started with, for its CPU.
func (r *runner) mysqlTarget(cfg serverConfig) dbTarget {
	t := dbTarget{Name: "MySQL", admin: r.mysqlSrv.admin, dsn: r.mysqlSrv.dsn, params: cfg.params, proc: "mysqld"}
	t.pid = mysqldPID(r.mysqlSrv.dsn)
	return t
}

// mysqldPID is the pid of the local mysqld started with --port= the DSN's
// port (scripts/mysql.sh's, in its chroot), or 0.
func mysqldPID(dsn string) int {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return 0
	}
	_, port, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return 0
	}
	matches, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, m := range matches {
		b, err := os.ReadFile(m)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if filepath.Base(args[0]) != "mysqld" {
			continue
		}
		for _, a := range args[1:] {
			if a == "--port="+port {
				pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(m)))
				return pid
			}
		}
	}
	return 0
}

// settle waits, up to a minute, until the database servers are quiet (under
// 5% of a CPU over 300 ms): a run's purge and page flushing would otherwise
// take CPU from the next run, on the same server or the other. Every
// measured burst starts after it.
func (r *runner) settle() {
	pids := map[string]int{}
	if r.serverPID > 0 {
		pids["own"] = r.serverPID
	}
	if r.mysqlSrv != nil {
		if pid := mysqldPID(r.mysqlSrv.dsn); pid > 0 {
			pids["mysql"] = pid
		}
	}
	const span = 300 * time.Millisecond
	start := time.Now()
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		before := cpuTimes(pids)
		time.Sleep(span)
		after := cpuTimes(pids)
		busy := 0.0
		for k := range pids {
			busy += after[k] - before[k]
		}
		if busy < 0.05*float64(span/time.Millisecond) {
			if waited := time.Since(start); waited > 2*time.Second {
				progress("waited %s for the database servers to be quiet", waited.Round(100*time.Millisecond))
			}
			return
		}
	}
	progress("the database servers were still busy after a minute; measuring anyway")
}

// emptyDatabase creates a database with no tables on admin's server, and
// returns its DSN with params, and a drop function.
func emptyDatabase(admin *sql.DB, server string, params map[string]string) (string, func(), error) {
	return newDatabase(admin, server, "bench_dropin_", params, false, func(*sql.DB) error { return nil })
}

// dropInResult is the section: for each server, NanoCMD's own server then
// stepcollect's in its place.
type dropInResult struct {
	Mode     string       `json:"mode"` // "dropin"
	N        int          `json:"n"`
	Inflight int          `json:"inflight"`
	Setting  string       `json:"setting"`
	Pairs    []dropInPair `json:"pairs"`
}

type dropInPair struct {
	Server  string  `json:"server"`
	Version string  `json:"version"`
	NanoCMD *e2eRun `json:"nanocmd"`
	Ours    *e2eRun `json:"stepcollect_nanocmd"`
}

// dropIn runs the section on the bench's server and, with -mysql-dsn, on
// MySQL, at the defaults setting.
func (r *runner) dropIn(n, inflight int, outDir string) (*dropInResult, error) {
	cfg := configs[0]
	res := &dropInResult{Mode: "dropin", N: n, Inflight: inflight, Setting: cfg.Name}
	targets := []dbTarget{r.ownTarget(cfg)}
	versions := []string{r.version}
	if r.mysqlSrv != nil {
		targets = append(targets, r.mysqlTarget(mysqlConfigs(r.mysqlSrv, 1000)[0]))
		versions = append(versions, r.mysqlSrv.version)
	}
	for i, t := range targets {
		p := dropInPair{Server: t.Name, Version: versions[i]}
		var err error
		if p.NanoCMD, err = r.e2eNanoCMD(nanocmdOwn, t, n, inflight, ""); err != nil {
			return nil, fmt.Errorf("%s on %s: %w", e2eNanoCMD, t.Name, err)
		}
		prof, _ := filepath.Abs(filepath.Join(outDir, "dropin-"+strings.ToLower(t.Name)+"-nanocmd.cpu.pprof"))
		if p.Ours, err = r.e2eNanoCMD(nanocmdOurs, t, n, inflight, prof); err != nil {
			return nil, fmt.Errorf("%s on %s: %w", e2eDropIn, t.Name, err)
		}
		res.Pairs = append(res.Pairs, p)
	}
	return res, nil
}

// markdown is the section: one table, a pair of columns a server.
func (d *dropInResult) markdown() string {
	if len(d.Pairs) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## NanoCMD's server and stepcollect's `nanocmd` in its place\n\n"+
		"What a NanoCMD operator gets by swapping the binary: NanoCMD v0.7.1's own `cmd/nanocmd` (built from its module, on a database "+
		"with its `schema.sql` loaded) and stepcollect's `cmd/nanocmd` (on an empty database: it makes its tables at start), each "+
		"run with the same command line, every flag at its default but `-storage mysql -storage-dsn … -api … -enqueue-url … "+
		"-push-url … -enqueue-api …` (so stepcollect's collects in process, with its periodic sweep). The same work for both: the "+
		"inventory workflow started for N=%d enrollments in one `POST /v1/workflow/…/start`, its two commands enqueued to a fake "+
		"NanoMDM in the bench process, then all %d results through NanoMDM v0.9.0's webhook sender, %d enrollments at a time, each "+
		"enrollment's two results one after the other. **Every enrollment done**: every enrollment's serial number and SIP state "+
		"in the inventory route (`GET /inventory` with the N ids), looked at once `id_commands` is empty after the last answer, "+
		"and every 10 ms after until it holds them all. NanoCMD keeps the inventory in memory; stepcollect's `nanocmd` in MySQL, "+
		"committed in the webhook's request. The **%s** setting (sessions write no binary log), one pair a server, one after "+
		"the other. **CPU per webhook** is the `nanocmd` process's and the database server's user + system time over the window, "+
		"divided by the webhooks sent; **ratio** is stepcollect's ÷ NanoCMD's.\n\n", d.N, 2*d.N, d.Inflight, d.Setting)

	b.WriteString("|")
	for _, p := range d.Pairs {
		fmt.Fprintf(&b, " | %s: NanoCMD v0.7.1 | %s: stepcollect `nanocmd` | ratio", p.Server, p.Server)
	}
	b.WriteString(" |\n|---" + strings.Repeat("|--:|--:|--:", len(d.Pairs)) + "|\n")
	row := func(label string, cell func(*e2eRun) string, num func(*e2eRun) float64) {
		b.WriteString("| " + label)
		for _, p := range d.Pairs {
			r := "–"
			if num != nil {
				r = ratioOf(num(p.NanoCMD), num(p.Ours))
			}
			fmt.Fprintf(&b, " | %s | %s | %s", cell(p.NanoCMD), cell(p.Ours), r)
		}
		b.WriteString(" |\n")
	}
	done := func(r *e2eRun) string {
		if r.DoneMS == 0 {
			return fmt.Sprintf("not within the wait (%d of %d)", r.Done, d.N)
		}
		return dur(r.DoneMS)
	}
	ms := func(v float64) string { return fmt.Sprintf("%.3f ms", v) }
	perWebhook := func(r *e2eRun) float64 { return r.cpuPerWebhook(true, true) }
	row("**release to every enrollment done**", done, func(r *e2eRun) float64 { return r.DoneMS })
	row("webhooks answered 200 / sent", func(r *e2eRun) string {
		return fmt.Sprintf("%d / %d%s", r.OK, r.Webhooks, errSuffix(r.Errors))
	}, nil)
	row("webhook p50", func(r *e2eRun) string { return dur(r.P50MS) }, func(r *e2eRun) float64 { return r.P50MS })
	row("webhook p99", func(r *e2eRun) string { return dur(r.P99MS) }, func(r *e2eRun) float64 { return r.P99MS })
	row("**CPU per webhook, nanocmd + database**", func(r *e2eRun) string { return ms(perWebhook(r)) }, perWebhook)
	row("… nanocmd", func(r *e2eRun) string { return ms(r.cpuPerWebhook(true, false)) }, func(r *e2eRun) float64 { return r.cpuPerWebhook(true, false) })
	row("… the database server", func(r *e2eRun) string {
		if _, ok := r.CPU[r.dbProc()]; !ok {
			return "not measured"
		}
		return ms(r.cpuPerWebhook(false, true))
	}, func(r *e2eRun) float64 { return r.cpuPerWebhook(false, true) })
	row("statements per result (`Questions`)", func(r *e2eRun) string { return fmt.Sprintf("%.2f", r.perResult("Questions")) },
		func(r *e2eRun) float64 { return r.perResult("Questions") })
	row("connections opened per result", func(r *e2eRun) string { return fmt.Sprintf("%.2f", r.perResult("Connections")) },
		func(r *e2eRun) float64 { return r.perResult("Connections") })
	row("enqueue requests to NanoMDM (empty bodies)", func(r *e2eRun) string {
		if r.MDM == nil {
			return "–"
		}
		return fmt.Sprintf("%d (%d)", r.MDM.Enqueues, r.MDM.EmptyBodies)
	}, nil)
	row("left behind: steps / id_commands / step_commands", func(r *e2eRun) string {
		return fmt.Sprintf("%d / %d / %d", r.Stranded.Steps, r.Stranded.IDCommands, r.Stranded.StepCommands)
	}, nil)
	b.WriteString("\n")
	for _, p := range d.Pairs {
		fmt.Fprintf(&b, "%s: %s. NanoCMD's workflow start: %s.\n\n", p.Server, p.Version, p.NanoCMD.Start)
		for _, prof := range p.Ours.Profiles {
			fmt.Fprintf(&b, "stepcollect's `nanocmd` on %s, the whole life of the process, `go tool pprof -top -nodecount=10` (flat), from `%s`:\n\n```\n%s\n```\n\n",
				p.Server, prof.Path, strings.TrimSpace(prof.Top))
		}
		if p.Ours.ProfileNote != "" {
			fmt.Fprintf(&b, "%s\n\n", strings.TrimSpace(p.Ours.ProfileNote))
		}
	}
	b.WriteString(d.goals())
	b.WriteString("\n")
	return b.String()
}

// goals is the section's goal line: at most half of NanoCMD's time and
// CPU per webhook, on every server, with every webhook 200 and nothing
// left behind.
func (d *dropInResult) goals() string {
	var b strings.Builder
	for _, p := range d.Pairs {
		nc, sc := p.NanoCMD, p.Ours
		clean := sc.OK == sc.Webhooks && sc.Done == d.N && sc.Stranded.Steps+sc.Stranded.IDCommands+sc.Stranded.StepCommands == 0
		timeX, cpuX := ratioValue(nc.DoneMS, sc.DoneMS), ratioValue(nc.cpuPerWebhook(true, true), sc.cpuPerWebhook(true, true))
		verdict := "missed"
		if clean && timeX > 0 && timeX <= 0.5 && cpuX > 0 && cpuX <= 0.5 {
			verdict = "met"
		}
		fmt.Fprintf(&b, "- **stepcollect's `nanocmd` at most half of NanoCMD's time and CPU per webhook** (%s, N=%d): time %.2f×, CPU %.2f×, "+
			"%d/%d webhooks 200, %d/%d enrollments in the inventory route, %d steps left: **%s**.\n",
			p.Server, d.N, timeX, cpuX, sc.OK, sc.Webhooks, sc.Done, d.N, sc.Stranded.Steps, verdict)
	}
	return b.String()
}

// ratioValue is b ÷ a, or 0 where either is missing.
func ratioValue(a, b float64) float64 {
	if a == 0 || b == 0 {
		return 0
	}
	return b / a
}

func ratioOf(a, b float64) string {
	if x := ratioValue(a, b); x > 0 {
		return fmt.Sprintf("%.2f×", x)
	}
	return "–"
}
