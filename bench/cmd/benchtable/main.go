// Command benchtable runs the fan-out benchmark for every implementation,
// side by side in one run on one server, each measurement on a fresh
// database, and writes a markdown table. The implementations are separate
// binaries (see the Makefile's bench target): one Go build can hold only one
// version of NanoCMD.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// impl is one row family: a binary and the DSN parameters it runs with.
type impl struct {
	label  string
	binary string
	params map[string]string
}

// serverConfig is one server setting the run is repeated under, applied per
// session through the DSN so the shared server's GLOBAL settings stay as
// they are.
type serverConfig struct {
	name   string
	params func(mariadb bool) map[string]string
}

func main() {
	var (
		binDir  = flag.String("bin", "bin/bench", "directory of the fanout-* binaries")
		server  = flag.String("server", "root@tcp(127.0.0.1:3306)/", "MySQL/MariaDB server DSN (no database)")
		nsFlag  = flag.String("n", "3000", "comma-separated enrollment counts")
		pool    = flag.Int("pool", 128, "connection pool size of each implementation")
		control = flag.Bool("control", false, "also run the control (a step per enrollment)")
		out     = flag.String("out", "docs/bench/fanout.md", "markdown output")
		rawOut  = flag.String("json", "", "also write the raw results as JSON lines here")
	)
	flag.Parse()
	ns, err := parseInts(*nsFlag)
	if err != nil {
		die("-n: %v", err)
	}

	impls := []impl{
		{"NanoCMD v0.7.0", "fanout-nanocmd-v0.7.0", nil},
		{"NanoCMD v0.7.1", "fanout-nanocmd-v0.7.1", nil},
		{"NanoCMD v0.7.1, interpolateParams", "fanout-nanocmd-v0.7.1", map[string]string{"interpolateParams": "true"}},
		{"stepcollect, server-side prepare", "fanout-stepcollect", nil},
		{"stepcollect (as shipped: interpolateParams)", "fanout-stepcollect", map[string]string{"interpolateParams": "true"}},
	}
	configs := []serverConfig{
		{"defaults (REPEATABLE READ, lock wait 50 s)", func(bool) map[string]string { return nil }},
		{"stricter (READ COMMITTED, lock wait 2 s)", func(mariadb bool) map[string]string {
			iso := "transaction_isolation"
			if mariadb {
				iso = "tx_isolation"
			}
			return map[string]string{iso: "'READ-COMMITTED'", "innodb_lock_wait_timeout": "2"}
		}},
	}
	shapes := []bool{false}
	if *control {
		shapes = append(shapes, true)
	}

	admin, err := sql.Open("mysql", *server)
	if err != nil {
		die("server: %v", err)
	}
	defer admin.Close()
	var version string
	if err := admin.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		die("server: %v", err)
	}
	mariadb := strings.Contains(strings.ToLower(version), "mariadb")

	total := len(impls) * len(configs) * len(ns) * len(shapes)
	var results []*fanout.Result
	var rawLines bytes.Buffer
	i := 0
	for _, cfg := range configs {
		for _, n := range ns {
			for _, ctl := range shapes {
				for _, im := range impls {
					i++
					fmt.Fprintf(os.Stderr, "[%d/%d] %s, %s, N=%d%s ... ", i, total, im.label, cfg.name, n, ifs(ctl, " (control)"))
					params := map[string]string{}
					for k, v := range cfg.params(mariadb) {
						params[k] = v
					}
					for k, v := range im.params {
						params[k] = v
					}
					res, err := measure(admin, *server, filepath.Join(*binDir, im.binary), im.label, n, *pool, ctl, params)
					if err != nil {
						die("%s: %v", im.label, err)
					}
					res.Impl = im.label
					res.DSN = cfg.name // the table's config column
					fmt.Fprintf(os.Stderr, "%.0f ms, %d errors\n", res.WallMS, sum(res.Errors))
					results = append(results, res)
					b, _ := json.Marshal(res)
					rawLines.Write(append(b, '\n'))
				}
			}
		}
	}

	md := table(results, version, *pool)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		die("%v", err)
	}
	if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
		die("%v", err)
	}
	if *rawOut != "" {
		os.WriteFile(*rawOut, rawLines.Bytes(), 0o644)
	}
	fmt.Print(md)
}

// measure creates a database, migrates it with stepcollect's migrations
// (NanoCMD v0.7.1's schema, identical to v0.7.0's), runs one binary on it
// and drops it.
func measure(admin *sql.DB, server, binary, label string, n, pool int, control bool, params map[string]string) (*fanout.Result, error) {
	ctx := context.Background()
	b := make([]byte, 5)
	rand.Read(b)
	name := "bench_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		return nil, err
	}
	defer admin.Exec("DROP DATABASE IF EXISTS " + name)

	cfg, err := mysql.ParseDSN(server)
	if err != nil {
		return nil, err
	}
	cfg.DBName = name
	cfg.ParseTime = true
	mdb, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, err
	}
	err = stepmysql.Migrate(ctx, mdb)
	mdb.Close()
	if err != nil {
		return nil, err
	}

	dsn := cfg.FormatDSN()
	for k, v := range params {
		dsn += "&" + k + "=" + v
	}
	cmd := exec.Command(binary, "-label", label, "-dsn", dsn, "-n", strconv.Itoa(n), "-pool", strconv.Itoa(pool), "-control="+strconv.FormatBool(control))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %v: %s", binary, err, stderr.String())
	}
	var res fanout.Result
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("%s output: %v", binary, err)
	}
	return &res, nil
}

func table(results []*fanout.Result, version string, pool int) string {
	type key struct {
		cfg     string
		n       int
		control bool
	}
	base := map[key]float64{}
	for _, r := range results {
		if r.Impl == "NanoCMD v0.7.1" {
			base[key{r.DSN, r.N, r.Control}] = r.WallMS
		}
	}
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "Fan-out: one step to N enrollments, all reporting at the same moment; pool %d; %s; %s, %d CPUs (%s); %s.\n\n",
		pool, version, runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), host, time.Now().UTC().Format("2006-01-02"))
	b.WriteString("| implementation | server | N | shape | wall | p50 | p99 | completed | errors | stranded (steps/id_commands/step_commands) | wall vs v0.7.1 |\n")
	b.WriteString("|---|---|--:|---|--:|--:|--:|--:|---|---|--:|\n")
	sort.SliceStable(results, func(i, j int) bool {
		if results[i].DSN != results[j].DSN {
			return results[i].DSN < results[j].DSN
		}
		return results[i].N < results[j].N
	})
	for _, r := range results {
		ratio := "–"
		if v := base[key{r.DSN, r.N, r.Control}]; v > 0 {
			ratio = fmt.Sprintf("%.2f×", r.WallMS/v)
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %.0f ms | %.1f ms | %.1f ms | %d/%d | %s | %d/%d/%d | %s |\n",
			r.Impl, r.DSN, r.N, ifs(r.Control, "control", "shared"), r.WallMS, r.P50MS, r.P99MS,
			r.Completed, r.N, errString(r.Errors), r.Stranded.Steps, r.Stranded.IDCommands, r.Stranded.StepCommands, ratio)
	}
	b.WriteString("\n`wall vs v0.7.1` is wall time over NanoCMD v0.7.1's in the same server setting, N and shape: below 1× is faster.\n")
	return b.String()
}

func errString(m map[string]int) string {
	if len(m) == 0 {
		return "0"
	}
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d × %s", v, k))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

func sum(m map[string]int) int {
	t := 0
	for _, v := range m {
		t += v
	}
	return t
}

func ifs(c bool, yes string, no ...string) string {
	if c {
		return yes
	}
	if len(no) > 0 {
		return no[0]
	}
	return ""
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

func die(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "benchtable: "+format+"\n", a...)
	os.Exit(1)
}
