package deploy_test

import (
	"os"
	"os/exec"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// refRow is one row of a table in docs/reference.md: its cells, the first
// one's backticked name first.
type refRow struct {
	name  string
	cells []string
}

var backticked = regexp.MustCompile("`([^`]+)`")

// referenceTables returns the rows of the tables under each "### " or "## "
// heading of docs/reference.md whose first cell is backticked.
func referenceTables(t *testing.T) (string, map[string][]refRow) {
	t.Helper()
	b, err := os.ReadFile("../docs/reference.md")
	if err != nil {
		t.Fatal(err)
	}
	tables := map[string][]refRow{}
	section := ""
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "#") {
			section = strings.TrimSpace(strings.TrimLeft(l, "#"))
			continue
		}
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), " | ")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		m := backticked.FindStringSubmatch(cells[0])
		tables[section] = append(tables[section], refRow{name: m[1], cells: cells})
	}
	return string(b), tables
}

// helpFlag is one flag as a binary's -h describes it.
type helpFlag struct{ name, env, def string }

var (
	helpFlagLine = regexp.MustCompile(`^  -(\S+)`)
	helpEnv      = regexp.MustCompile(`\(env (STEPCOLLECT_[A-Z0-9_]+)\)|\[((?:NANOCMD|NANOHUB)_[A-Z0-9_]+)\]`)
	helpDefault  = regexp.MustCompile(`\(default "?(.*?)"?\)$`)
)

func helpFlags(t *testing.T, bin string) map[string]helpFlag {
	t.Helper()
	cmd := exec.Command(bin, "-h")
	// defaults as they are without any environment of the caller's
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "STEPCOLLECT_") && !strings.HasPrefix(kv, "NANOCMD_") && !strings.HasPrefix(kv, "NANOHUB_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, err := cmd.CombinedOutput() // nanocmd writes -h to stderr, as NanoCMD does
	if err != nil {
		t.Fatalf("%s -h: %v", bin, err)
	}
	flags := map[string]helpFlag{}
	var cur *helpFlag
	for _, l := range strings.Split(string(out), "\n") {
		if m := helpFlagLine.FindStringSubmatch(l); m != nil {
			flags[m[1]] = helpFlag{name: m[1]}
			f := flags[m[1]]
			cur = &f
		} else if cur != nil && strings.TrimSpace(l) != "" {
			if m := helpEnv.FindStringSubmatch(l); m != nil {
				cur.env = m[1] + m[2]
			}
			if m := helpDefault.FindStringSubmatch(l); m != nil {
				cur.def = m[1]
			}
			flags[cur.name] = *cur
		}
	}
	if len(flags) < 2 {
		t.Fatalf("%s -h: no flags read from\n%s", bin, out)
	}
	return flags
}

// Every flag each binary defines (read from its own -h) is in the table of
// that binary in docs/reference.md, with the environment variable -h
// names and, where the table gives one, the default -h shows; and every
// flag the tables list is one the binary has.
func TestTheReferenceListsEveryFlagOfEveryBinary(t *testing.T) {
	t.Parallel()
	bins, err := testkit.BuildPlain(t.TempDir(), "cmd/api", "cmd/worker", "cmd/nanocmd", "cmd/nanohub", "cmd/migrate")
	if err != nil {
		t.Fatal(err)
	}
	_, tables := referenceTables(t)
	shared := tables["Shared by `api` and `worker`"]
	documented := map[string][]refRow{
		"api":     append(append([]refRow{}, tables["`api`"]...), shared...),
		"worker":  append(append([]refRow{}, tables["`worker`"]...), shared...),
		"migrate": tables["`migrate`"],
		"nanocmd": tables["`nanocmd`"],
		"nanohub": tables["`nanohub`"],
	}
	for _, bin := range []string{"api", "worker", "migrate", "nanocmd", "nanohub"} {
		flags := helpFlags(t, bins[bin])
		rows := map[string]refRow{}
		for _, r := range documented[bin] {
			rows[strings.TrimPrefix(r.name, "-")] = r
		}
		var names []string
		for n := range flags {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			f := flags[n]
			r, ok := rows[n]
			if !ok {
				t.Errorf("%s -%s is not in docs/reference.md's table for %s", bin, n, bin)
				continue
			}
			env := "none"
			if f.env != "" {
				env = "`" + f.env + "`"
			}
			if len(r.cells) < 3 || r.cells[1] != env {
				t.Errorf("%s -%s: the reference says environment %q, -h says %s", bin, n, r.cells[1], env)
				continue
			}
			if m := backticked.FindStringSubmatch(r.cells[2]); m != nil && m[1] != f.def {
				t.Errorf("%s -%s: the reference says default %q, -h says %q", bin, n, m[1], f.def)
			} else if m == nil && f.def != "" && !strings.Contains(r.cells[2], "CPU") {
				t.Errorf("%s -%s: the reference gives no default (%q), -h says %q", bin, n, r.cells[2], f.def)
			}
		}
		for n := range rows {
			if _, ok := flags[n]; !ok {
				t.Errorf("docs/reference.md lists -%s for %s, which it does not have", n, bin)
			}
		}
	}
}

var metricPrefix = regexp.MustCompile(`^(stepcollect_|asynq_|go_sql_)`)

// Starts both services, scrapes them, and requires every stepcollect_,
// asynq_ and go_sql_ metric they export to be in docs/reference.md's
// metrics table, and every metric of that table to be exported. Also:
// stepcollect_build_info says what -version says, and -probe answers for
// both services (0 while ready, 1 once the worker is gone). Both run in
// one environment, each finding its own address there.
func TestTheReferenceListsEveryMetricAndTheBinariesProbeThemselves(t *testing.T) {
	t.Parallel()
	bins, err := testkit.BuildPlain(t.TempDir(), "cmd/api", "cmd/worker")
	if err != nil {
		t.Fatal(err)
	}
	doc, tables := referenceTables(t)
	documented := map[string]bool{}
	for _, r := range tables["Metrics"] {
		for _, c := range r.cells {
			for _, m := range backticked.FindAllStringSubmatch(c, -1) {
				if metricPrefix.MatchString(m[1]) && !strings.HasSuffix(m[1], "*") {
					documented[m[1]] = true
				}
			}
		}
	}
	if len(documented) < 25 {
		t.Fatalf("only %d metrics read from docs/reference.md's Metrics table: the parsing is broken", len(documented))
	}

	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	env := testkit.ServiceEnv(db.DSN, rs.URL, "STEPCOLLECT_LOG_LEVEL=warn")
	apiAddr, workerAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	// one environment for both, as make run and an env file shared by the
	// two give them: each takes its own address from it
	env = append(env, "STEPCOLLECT_LISTEN="+apiAddr, "STEPCOLLECT_METRICS_LISTEN="+workerAddr)
	apiEnv, workerEnv := env, env
	w := testkit.StartProc(t, bins["worker"], workerEnv)
	testkit.AwaitHTTP(t, w, "http://"+workerAddr+"/readyz", 20*time.Second)
	a := testkit.StartProc(t, bins["api"], apiEnv)
	testkit.AwaitHTTP(t, a, "http://"+apiAddr+"/readyz", 20*time.Second)

	// the gauge of the last sweep appears once the worker's first sweep
	// has recorded its findings
	exported := map[string]bool{}
	testkit.Watch(time.Now().Add(15*time.Second), func() bool {
		for _, u := range []string{"http://" + apiAddr + "/metrics", "http://" + workerAddr + "/metrics"} {
			fams, err := scrape.Families(u)
			if err != nil {
				t.Fatal(err)
			}
			for n := range fams {
				if metricPrefix.MatchString(n) {
					exported[n] = true
				}
			}
			if strings.Contains(u, apiAddr) {
				checkBuildInfo(t, bins["api"], fams)
			}
		}
		return exported["stepcollect_last_sweep_age_seconds"] // else the check below names it
	})
	for _, n := range sortedKeys(exported) {
		if !documented[n] {
			t.Errorf("%s is exported but not in docs/reference.md's Metrics table", n)
		}
	}
	for _, n := range sortedKeys(documented) {
		if !exported[n] {
			t.Errorf("docs/reference.md lists %s, which neither binary exports", n)
		}
	}
	if !strings.Contains(doc, "`-probe`") {
		t.Error("docs/reference.md does not describe -probe")
	}

	probe := func(bin string, env []string) (int, string) {
		cmd := exec.Command(bin, "-probe")
		cmd.Env = append(os.Environ(), env...)
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	if code, out := probe(bins["api"], apiEnv); code != 0 || !strings.Contains(out, "200 OK") {
		t.Errorf("api -probe against the running api: exit %d, %q", code, out)
	}
	if code, out := probe(bins["worker"], workerEnv); code != 0 || !strings.Contains(out, "200 OK") {
		t.Errorf("worker -probe against the running worker: exit %d, %q", code, out)
	}
	if err := w.Stop(); err != nil {
		t.Errorf("worker stop: %v", err)
	}
	if code, out := probe(bins["worker"], workerEnv); code != 1 {
		t.Errorf("worker -probe with no worker running: exit %d, %q; want 1", code, out)
	}
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

var versionLine = regexp.MustCompile(`^stepcollect \S+ (\S+) \(commit (\S+), built \S+, (go\S+)\)\n$`)

// checkBuildInfo requires stepcollect_build_info to be 1 with the labels
// bin's -version prints.
func checkBuildInfo(t *testing.T, bin string, fams map[string]*dto.MetricFamily) {
	t.Helper()
	out, err := exec.Command(bin, "-version").Output()
	m := versionLine.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		t.Fatalf("%s -version: %q, %v", bin, out, err)
	}
	f := fams["stepcollect_build_info"]
	if f == nil || len(f.GetMetric()) != 1 {
		t.Fatalf("stepcollect_build_info: %v; want one series", f)
	}
	labels := map[string]string{}
	for _, l := range f.GetMetric()[0].GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if labels["version"] != m[1] || labels["commit"] != m[2] || labels["go_version"] != m[3] || f.GetMetric()[0].GetGauge().GetValue() != 1 {
		t.Errorf("stepcollect_build_info %v = %v; -version says %q", labels, f.GetMetric()[0].GetGauge().GetValue(), out)
	}
}
