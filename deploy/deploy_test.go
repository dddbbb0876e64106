// Package deploy_test keeps the operations files honest: Prometheus accepts
// its configuration and rules, the alerts fire on what they should, every
// metric the dashboard and the alerts use is one the binaries export, and
// the compose file can be scaled and finds the files it mounts.
package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/stepcollect/stepcollect/internal/scrape"
	"github.com/stepcollect/stepcollect/internal/testdb"
	"github.com/stepcollect/stepcollect/internal/testproc"
	"github.com/stepcollect/stepcollect/internal/testredis"
)

func requirePromtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("promtool is required under CI (Debian package prometheus): %v", err)
		}
		t.Skipf("promtool not installed (apt-get install prometheus): %v", err)
	}
	return p
}

func promtool(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(requirePromtool(t), args...)
	cmd.Dir = "prometheus"
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestPromtoolAcceptsTheConfigAndTheRules(t *testing.T) {
	promtool(t, "check", "config", "prometheus.yml")
	promtool(t, "check", "rules", "rules/stepcollect.yml")
}

// The rules' own unit tests: each alert fires on the series that should
// fire it and stays quiet on healthy ones.
func TestAlertRulesFireOnWhatTheyShould(t *testing.T) {
	promtool(t, "test", "rules", "tests/stepcollect_test.yml")
}

var metricName = regexp.MustCompile(`\b(stepcollect_[a-z_]+|asynq_[a-z_]+|go_[a-z_]+|process_[a-z_]+)\b`)

// usedMetrics returns every metric name the dashboard's queries and the
// alert rules' expressions use, histogram suffixes removed.
func usedMetrics(t *testing.T) map[string][]string {
	t.Helper()
	used := map[string][]string{}
	add := func(where, expr string) {
		for _, m := range metricName.FindAllString(expr, -1) {
			for _, suf := range []string{"_bucket", "_sum", "_count"} {
				m = strings.TrimSuffix(m, suf)
			}
			used[m] = append(used[m], where)
		}
	}

	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile("grafana/dashboards/stepcollect.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			add("dashboard panel "+p.Title, tg.Expr)
		}
	}

	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err = os.ReadFile("prometheus/rules/stepcollect.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			add("alert "+r.Alert, r.Expr)
		}
	}
	return used
}

// Starts the real binaries, scrapes both, and requires every metric the
// dashboard and the alerts use to be exported.
func TestEveryMetricTheDashboardAndAlertsUseIsExported(t *testing.T) {
	used := usedMetrics(t)
	if len(used) < 10 {
		t.Fatalf("only %d metrics found in the dashboard and rules: the extraction is broken", len(used))
	}
	dir := t.TempDir()
	bins, err := testproc.Build(dir, "cmd/api", "cmd/worker")
	if err != nil {
		t.Fatal(err)
	}
	db, rs := testdb.New(t, nil), testredis.Start(t)
	env := []string{"STEPCOLLECT_MYSQL_DSN=" + db.DSN, "STEPCOLLECT_REDIS_URL=" + rs.URL, "STEPCOLLECT_LOG_LEVEL=warn"}
	apiAddr, workerAddr := testproc.FreeAddr(t), testproc.FreeAddr(t)
	w := testproc.Start(t, bins["worker"], env, "-metrics-listen", workerAddr)
	testproc.AwaitHTTP(t, w, "http://"+workerAddr+"/readyz", 20*time.Second)
	a := testproc.Start(t, bins["api"], env, "-listen", apiAddr)
	testproc.AwaitHTTP(t, a, "http://"+apiAddr+"/readyz", 20*time.Second)

	exported := map[string]bool{}
	for _, u := range []string{"http://" + apiAddr + "/metrics", "http://" + workerAddr + "/metrics"} {
		fams, err := scrape.Families(u)
		if err != nil {
			t.Fatal(err)
		}
		for n := range fams {
			exported[n] = true
		}
	}
	var names []string
	for n := range used {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if !exported[n] {
			t.Errorf("%s is used by %s but no binary exports it", n, strings.Join(used[n], ", "))
		}
	}
	t.Logf("%d metrics used by the dashboard and alerts", len(names))
}

// The compose file: MySQL and Redis have health checks the services wait
// for, the worker scales (no container name, no host port), and every file
// Prometheus and Grafana mount exists.
func TestComposeFileScalesAndMountsFilesThatExist(t *testing.T) {
	var compose struct {
		Services map[string]struct {
			Image         string         `yaml:"image"`
			ContainerName string         `yaml:"container_name"`
			Ports         []string       `yaml:"ports"`
			Healthcheck   map[string]any `yaml:"healthcheck"`
			DependsOn     map[string]struct {
				Condition string `yaml:"condition"`
			} `yaml:"depends_on"`
			Volumes     []string          `yaml:"volumes"`
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	// depends_on is a list for some services; read those loosely
	if err := yaml.Unmarshal(b, &compose); err != nil {
		var loose struct {
			Services map[string]map[string]any `yaml:"services"`
		}
		if err2 := yaml.Unmarshal(b, &loose); err2 != nil {
			t.Fatalf("docker-compose.yml: %v", err2)
		}
	}
	s := compose.Services
	for _, name := range []string{"mysql", "redis", "api", "worker", "prometheus", "grafana"} {
		if _, ok := s[name]; !ok {
			t.Errorf("service %s missing", name)
		}
	}
	if s["mysql"].Image != "mysql:8.4" || !strings.HasPrefix(s["redis"].Image, "redis:7") {
		t.Errorf("images: mysql %q, redis %q; want mysql:8.4 and redis:7", s["mysql"].Image, s["redis"].Image)
	}
	for _, name := range []string{"mysql", "redis"} {
		if len(s[name].Healthcheck) == 0 {
			t.Errorf("%s has no health check", name)
		}
	}
	for _, name := range []string{"api", "worker"} {
		for _, dep := range []string{"mysql", "redis"} {
			if s[name].DependsOn[dep].Condition != "service_healthy" {
				t.Errorf("%s does not wait for %s to be healthy", name, dep)
			}
		}
	}
	if w := s["worker"]; w.ContainerName != "" || len(w.Ports) > 0 {
		t.Errorf("worker cannot scale: container_name %q, ports %v", w.ContainerName, w.Ports)
	}
	if s["worker"].Environment["STEPCOLLECT_METRICS_LISTEN"] != "0.0.0.0:9101" || s["api"].Environment["STEPCOLLECT_LISTEN"] != "0.0.0.0:9100" {
		t.Error("api or worker listens on loopback inside its container: Prometheus could not scrape it")
	}
	for _, name := range []string{"prometheus", "grafana"} {
		for _, v := range s[name].Volumes {
			src := strings.SplitN(v, ":", 2)[0]
			if !strings.HasPrefix(src, "./") {
				continue // a named volume
			}
			if _, err := os.Stat(filepath.Join("..", src)); err != nil {
				t.Errorf("%s mounts %s: %v", name, src, err)
			}
		}
	}

	// the dashboard's datasource is the provisioned one
	var ds struct {
		Datasources []struct {
			UID string `yaml:"uid"`
		} `yaml:"datasources"`
	}
	b, _ = os.ReadFile("grafana/provisioning/datasources/prometheus.yml")
	if err := yaml.Unmarshal(b, &ds); err != nil || len(ds.Datasources) != 1 {
		t.Fatalf("datasource provisioning: %v", err)
	}
	dash, _ := os.ReadFile("grafana/dashboards/stepcollect.json")
	if want := fmt.Sprintf(`"uid": %q`, ds.Datasources[0].UID); !strings.Contains(string(dash), want) {
		t.Errorf("dashboard does not use the provisioned datasource %s", want)
	}
}

// Every alert links its runbook section, and the section exists.
func TestEveryAlertHasARunbookSection(t *testing.T) {
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert       string            `yaml:"alert"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	b, err := os.ReadFile("prometheus/rules/stepcollect.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &rules); err != nil {
		t.Fatal(err)
	}
	runbook, err := os.ReadFile("../docs/runbook.md")
	if err != nil {
		t.Fatal(err)
	}
	const base = "https://github.com/stepcollect/stepcollect/blob/main/docs/runbook.md#"
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			url := r.Annotations["runbook_url"]
			if url != base+strings.ToLower(r.Alert) {
				t.Errorf("alert %s: runbook_url %q, want %s%s", r.Alert, url, base, strings.ToLower(r.Alert))
			}
			if !strings.Contains(string(runbook), "\n## "+r.Alert+"\n") {
				t.Errorf("alert %s: no section \"## %s\" in docs/runbook.md", r.Alert, r.Alert)
			}
		}
	}
	if n < 10 {
		t.Fatalf("only %d alerts read: the parsing is broken", n)
	}
}
