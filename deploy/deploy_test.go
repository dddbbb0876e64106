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
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
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
	t.Parallel()
	promtool(t, "check", "config", "prometheus.yml")
	promtool(t, "check", "rules", "rules/stepcollect.yml")
}

// The rules' own unit tests: each alert fires on the series that should
// fire it and stays quiet on healthy ones.
// Alertmanager takes the compose stack's configuration, and Prometheus
// sends its alerts there.
func TestAmtoolAcceptsTheAlertmanagerConfig(t *testing.T) {
	t.Parallel()
	testkit.RequireBinary(t, "amtool") // Debian package prometheus-alertmanager
	out, err := exec.Command("amtool", "check-config", "alertmanager/alertmanager.yml").CombinedOutput()
	if err != nil {
		t.Fatalf("amtool check-config: %v\n%s", err, out)
	}
	b, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "targets: [alertmanager:9093]") {
		t.Error("prometheus.yml sends alerts to no alertmanager:9093")
	}
}

func TestAlertRulesFireOnWhatTheyShould(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
	used := usedMetrics(t)
	if len(used) < 10 {
		t.Fatalf("only %d metrics found in the dashboard and rules: the extraction is broken", len(used))
	}
	dir := t.TempDir()
	bins, err := testkit.Build(dir, "cmd/api", "cmd/worker")
	if err != nil {
		t.Fatal(err)
	}
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	env := testkit.ServiceEnv(db.DSN, rs.URL, "STEPCOLLECT_LOG_LEVEL=warn")
	_, workerURL := testkit.StartService(t, bins["worker"], env, "metrics-listen")
	_, apiURL := testkit.StartService(t, bins["api"], env, "listen")

	exported := map[string]bool{}
	for _, u := range []string{apiURL + "/metrics", workerURL + "/metrics"} {
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
	t.Parallel()
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
	// MariaDB 10.11 by default; MySQL 9.7 is the override in
	// docker-compose.mysql.yml (TestTheMySQLOverrideSwapsOnlyTheServer)
	if !strings.HasPrefix(s["mysql"].Image, "mariadb:10.11.") || !strings.HasPrefix(s["redis"].Image, "redis:7") {
		t.Errorf("images: mysql %q, redis %q; want mariadb:10.11.x and redis:7", s["mysql"].Image, s["redis"].Image)
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

	// the dashboard's datasource is the provisioned one: its data source
	// variable (which every panel's ${DS_PROMETHEUS} resolves to when
	// provisioned) starts on the provisioned uid
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
	if want := fmt.Sprintf(`"value": %q`, ds.Datasources[0].UID); !strings.Contains(string(dash), want) {
		t.Errorf("dashboard's data source variable does not start on the provisioned datasource (%s)", want)
	}
}

// Every alert links its runbook section, and the section exists.
func TestEveryAlertHasARunbookSection(t *testing.T) {
	t.Parallel()
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

// service is one compose service, read loosely (depends_on and
// healthcheck.test each have two forms).
type service map[string]any

func readCompose(t *testing.T, path string) (map[string]service, map[string]any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// plain maps all the way down (yaml.v3 gives nested maps the type of
	// the map they are in)
	var f struct {
		Services map[string]map[string]any `yaml:"services"`
		Volumes  map[string]any            `yaml:"volumes"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	services := map[string]service{}
	for n, s := range f.Services {
		services[n] = s
	}
	return services, f.Volumes
}

func (s service) str(key string) string { v, _ := s[key].(string); return v }

func (s service) strs(key string) []string {
	var out []string
	switch v := s[key].(type) {
	case []any:
		for _, x := range v {
			out = append(out, fmt.Sprint(x))
		}
	case string:
		out = strings.Fields(v)
	}
	return out
}

// dependsOn is depends_on as service: condition (a list means started).
func (s service) dependsOn() map[string]string {
	out := map[string]string{}
	switch v := s["depends_on"].(type) {
	case []any:
		for _, x := range v {
			out[fmt.Sprint(x)] = "service_started"
		}
	case map[string]any:
		for name, c := range v {
			cond, _ := c.(map[string]any)["condition"].(string)
			if cond == "" {
				cond = "service_started"
			}
			out[name] = cond
		}
	}
	return out
}

func (s service) env() map[string]string {
	out := map[string]string{}
	if m, ok := s["environment"].(map[string]any); ok {
		for k, v := range m {
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}

func (s service) healthcheck() (test []string, timeout time.Duration) {
	h, _ := s["healthcheck"].(map[string]any)
	switch v := h["test"].(type) {
	case []any:
		for _, x := range v {
			test = append(test, fmt.Sprint(x))
		}
	case string:
		test = []string{"CMD-SHELL", v}
	}
	timeout, _ = time.ParseDuration(fmt.Sprint(h["timeout"]))
	return test, timeout
}

// An image is pinned by a digest, or by a tag holding an exact version
// (1.2.3, v2.53.0, 10.11.19, 1.26.8-bookworm; not latest, 7 or 8.4).
var (
	digestPinned  = regexp.MustCompile(`^[^@\s]+@sha256:[0-9a-f]{64}$`)
	versionPinned = regexp.MustCompile(`^[^:@\s]+:v?\d+\.\d+\.\d+([-.][A-Za-z0-9.-]+)?$`)
)

func isPinned(image string) bool {
	return digestPinned.MatchString(image) || versionPinned.MatchString(image)
}

// The stack starts in order: MySQL and Redis healthy, then the one-shot
// migrate, then the api and the workers (with -migrate=false, healthy
// through their own -probe), then Prometheus and Grafana. Every image is
// pinned to an exact version, and every image built here says so.
func TestComposeStartsTheStackInOrderWithPinnedImages(t *testing.T) {
	t.Parallel()
	s, _ := readCompose(t, "../docker-compose.yml")
	var names []string
	for n := range s {
		names = append(names, n)
	}
	sort.Strings(names)
	if got, want := strings.Join(names, " "), "alertmanager api grafana migrate mysql prometheus redis worker"; got != want {
		t.Errorf("services: %s, want %s", got, want)
	}

	for _, n := range names {
		svc, image := s[n], s[n].str("image")
		_, built := svc["build"]
		switch {
		case built && !strings.HasPrefix(image, "stepcollect:"):
			t.Errorf("%s is built here but tagged %q, not stepcollect:…", n, image)
		case !built && strings.HasPrefix(image, "stepcollect:"):
			t.Errorf("%s runs the image built here (%s) but has no build: (docker compose up would pull it)", n, image)
		case !built && !isPinned(image):
			t.Errorf("%s: image %q is not pinned to an exact version or digest", n, image)
		}
		if built {
			b, _ := svc["build"].(map[string]any)
			if b["context"] != "." {
				t.Errorf("%s: build context %v, want . (the Dockerfile at the root)", n, b["context"])
			}
			if args, _ := b["args"].(map[string]any); args["VERSION"] == nil || args["COMMIT"] == nil {
				t.Errorf("%s: build args %v lack VERSION and COMMIT (what -version prints)", n, args)
			}
		}
		for dep := range svc.dependsOn() {
			if _, ok := s[dep]; !ok {
				t.Errorf("%s depends on %s, which is not a service", n, dep)
			}
		}
	}

	m := s["migrate"]
	if got := m.strs("command"); strings.Join(got, " ") != "/migrate" {
		t.Errorf("migrate runs %v, want /migrate", got)
	}
	if r := m.str("restart"); r != "" && r != "no" {
		t.Errorf("migrate restart: %q; a one-shot must not restart", r)
	}
	if m.dependsOn()["mysql"] != "service_healthy" {
		t.Errorf("migrate does not wait for mysql to be healthy: %v", m.dependsOn())
	}

	for _, n := range []string{"api", "worker"} {
		svc := s[n]
		deps := svc.dependsOn()
		if deps["migrate"] != "service_completed_successfully" || deps["mysql"] != "service_healthy" || deps["redis"] != "service_healthy" {
			t.Errorf("%s depends_on %v; want migrate service_completed_successfully, mysql and redis service_healthy", n, deps)
		}
		env := svc.env()
		if env["STEPCOLLECT_MIGRATE"] != "false" {
			t.Errorf("%s: STEPCOLLECT_MIGRATE=%q; the migrate service migrates, so false", n, env["STEPCOLLECT_MIGRATE"])
		}
		if env["STEPCOLLECT_MYSQL_DSN"] != m.env()["STEPCOLLECT_MYSQL_DSN"] {
			t.Errorf("%s uses %q, migrate migrates %q", n, env["STEPCOLLECT_MYSQL_DSN"], m.env()["STEPCOLLECT_MYSQL_DSN"])
		}
		cmd := svc.strs("command")
		test, timeout := svc.healthcheck()
		if len(cmd) == 0 || strings.Join(test, " ") != "CMD "+cmd[0]+" -probe" {
			t.Errorf("%s runs %v, health check %v; want [CMD %s -probe] (distroless has no shell)", n, cmd, test, strings.Join(cmd, " "))
		}
		if timeout <= 4*time.Second {
			t.Errorf("%s: health check timeout %v; -probe waits up to 4 s", n, timeout)
		}
		if d, err := time.ParseDuration(svc.str("stop_grace_period")); err != nil || d < 20*time.Second {
			t.Errorf("%s: stop_grace_period %q; it needs time to finish what is in flight", n, svc.str("stop_grace_period"))
		}
	}

	// the order docker compose starts them in: a topological order of
	// depends_on, and no cycle
	order := map[string]int{}
	var visit func(n string, path []string)
	visit = func(n string, path []string) {
		if _, done := order[n]; done {
			return
		}
		for _, p := range path {
			if p == n {
				t.Fatalf("depends_on cycle: %s", strings.Join(append(path, n), " -> "))
			}
		}
		deps := s[n].dependsOn()
		var ds []string
		for d := range deps {
			ds = append(ds, d)
		}
		sort.Strings(ds)
		for _, d := range ds {
			visit(d, append(path, n))
		}
		order[n] = len(order)
	}
	for _, n := range names {
		visit(n, nil)
	}
	for _, before := range [][2]string{{"mysql", "migrate"}, {"migrate", "api"}, {"migrate", "worker"}, {"redis", "api"}, {"redis", "worker"},
		{"api", "prometheus"}, {"worker", "prometheus"}, {"prometheus", "grafana"}} {
		if order[before[0]] >= order[before[1]] {
			t.Errorf("%s does not start before %s", before[0], before[1])
		}
	}
}

// docker-compose.mysql.yml replaces the server and nothing else: the same
// service name (so every DSN holds), the MySQL version CI tests on pinned
// exactly, its binary log kept on with sync_binlog=1, a health check the
// MySQL image can run, and a data volume of its own.
func TestTheMySQLOverrideSwapsOnlyTheServer(t *testing.T) {
	t.Parallel()
	over, volumes := readCompose(t, "../docker-compose.mysql.yml")
	base, _ := readCompose(t, "../docker-compose.yml")
	if len(over) != 1 || over["mysql"] == nil {
		t.Fatalf("the override has services %v; want mysql alone", over)
	}
	o := over["mysql"]
	// the version scripts/mysql.sh brings up for `make test-mysql`
	if got, want := o.str("image"), "mysql:9.7.4"; got != want {
		t.Errorf("override image %q, want %q (the version the suites run on)", got, want)
	}
	command := " " + strings.Join(o.strs("command"), " ") + " "
	for _, want := range []string{" --sync-binlog=1 ", " --log-bin=", " --authentication-policy=caching_sha2_password "} {
		if !strings.Contains(command, want) {
			t.Errorf("override command %q lacks %q", command, strings.TrimSpace(want))
		}
	}
	for _, off := range []string{"--skip-log-bin", "--disable-log-bin", "--sync-binlog=0", "mysql_native_password"} {
		if strings.Contains(command, off) {
			t.Errorf("override command %q has %q", command, off)
		}
	}
	if test, _ := o.healthcheck(); len(test) < 2 || test[0] != "CMD" || test[1] != "mysqladmin" {
		t.Errorf("override health check %v: the MySQL image has mysqladmin, not MariaDB's healthcheck.sh", test)
	}
	baseVols, overVols := base["mysql"].strs("volumes"), o.strs("volumes")
	if len(overVols) != 1 || len(baseVols) != 1 || overVols[0] == baseVols[0] ||
		!strings.HasSuffix(overVols[0], ":/var/lib/mysql") {
		t.Errorf("volumes: base %v, override %v; want the override's own volume on /var/lib/mysql", baseVols, overVols)
	} else if _, ok := volumes[strings.SplitN(overVols[0], ":", 2)[0]]; !ok {
		t.Errorf("the override's volume %s is not declared in its volumes:", overVols[0])
	}
	// the DSN the services use works on it: same user, password, database
	dsn := base["api"].env()["STEPCOLLECT_MYSQL_DSN"]
	env := o.env()
	if want := env["MYSQL_USER"] + ":" + env["MYSQL_PASSWORD"] + "@tcp(mysql:3306)/" + env["MYSQL_DATABASE"] + "?"; !strings.HasPrefix(dsn, want) {
		t.Errorf("the services' DSN %q does not match the MySQL user and database %q", dsn, want)
	}
}

// The compose files run the servers the suites ran on: on MySQL (`make
// test-mysql`) the override's tag is the test server's exact version; on
// MariaDB (`make test`) the base file's tag has its major and minor (Debian
// moves the patch level with its updates).
func TestTheComposeServersAreTheTestedOnes(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	// 9.7.4-2 (Debian's build), 10.11.19-MariaDB-0+deb12u1
	number, _, _ := strings.Cut(version, "-")
	if strings.Contains(version, "MariaDB") {
		base, _ := readCompose(t, "../docker-compose.yml")
		parts := strings.SplitN(number, ".", 3)
		if image, want := base["mysql"].str("image"), "mariadb:"+parts[0]+"."+parts[1]+"."; !strings.HasPrefix(image, want) {
			t.Errorf("docker-compose.yml runs %s; the suites run on MariaDB %s", image, version)
		}
		return
	}
	over, _ := readCompose(t, "../docker-compose.mysql.yml")
	if image, want := over["mysql"].str("image"), "mysql:"+number; image != want {
		t.Errorf("docker-compose.mysql.yml runs %s; the suites run on MySQL %s (want %s)", image, version, want)
	}
}

// The Dockerfile's images are pinned, it builds /api, /worker and /migrate
// into the final image, and its build step, run here as the builder would
// run it, stamps each binary's -version with the build arguments.
func TestTheDockerfileBuildsEveryBinaryStamped(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	var froms []string
	for _, l := range strings.Split(text, "\n") {
		if f := strings.Fields(l); len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			froms = append(froms, f[1])
			if !isPinned(f[1]) {
				t.Errorf("FROM %s is not pinned to an exact version or digest", f[1])
			}
		}
	}
	if len(froms) != 2 || !strings.Contains(froms[1], "distroless") || !strings.Contains(froms[1], "@sha256:") {
		t.Errorf("stages %v: want a builder and distroless pinned by digest", froms)
	}
	if !strings.Contains(text, "COPY --from=build /out/api /out/worker /out/migrate /out/nanocmd /out/nanohub /") {
		t.Error("the final image does not get /api, /worker, /migrate, /nanocmd and /nanohub")
	}

	// the RUN instruction that builds, joined from its continuation lines
	var run string
	lines := strings.Split(text, "\n")
	for i := 0; i < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "RUN ") || !strings.Contains(strings.Join(lines[i:min(i+10, len(lines))], "\n"), "go build") {
			continue
		}
		cmd := strings.TrimPrefix(lines[i], "RUN ")
		for strings.HasSuffix(cmd, "\\") && i+1 < len(lines) {
			i++
			cmd = strings.TrimSuffix(cmd, "\\") + "\n" + lines[i]
		}
		run = cmd
		break
	}
	for _, main := range []string{"cmd/api", "cmd/worker", "cmd/migrate", "cmd/nanocmd", "cmd/nanohub"} {
		if !strings.Contains(run, main) {
			t.Errorf("the build step does not build %s:\n%s", main, run)
		}
	}
	if testing.Short() {
		t.Skip("-short: not running the build step")
	}
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", strings.ReplaceAll(run, "/out/", dir+"/"))
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "VERSION=v0.0.0-dockerfile-test", "COMMIT=0123456789ab", "BUILD_DATE=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the Dockerfile's build step: %v\n%s\n%s", err, run, out)
	}
	for _, bin := range []string{"api", "worker", "migrate"} {
		out, err := exec.Command(filepath.Join(dir, bin), "-version").Output()
		want := regexp.MustCompile(`^stepcollect ` + bin + ` v0\.0\.0-dockerfile-test \(commit 0123456789ab, built 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ, go[0-9.]+\)\n$`)
		if err != nil || !want.Match(out) {
			t.Errorf("%s -version: %q, %v; want %s", bin, out, err, want)
		}
	}
	// nanocmd and nanohub print the version alone, as NanoCMD and NanoHUB do
	for _, bin := range []string{"nanocmd", "nanohub"} {
		if out, err := exec.Command(filepath.Join(dir, bin), "-version").Output(); err != nil || string(out) != "v0.0.0-dockerfile-test\n" {
			t.Errorf("%s -version: %q, %v; want the stamped version alone", bin, out, err)
		}
	}
}

// dashboardPanels walks every panel, those inside rows included.
func dashboardPanels(panels []any, f func(p map[string]any)) {
	for _, x := range panels {
		p, _ := x.(map[string]any)
		f(p)
		if inner, ok := p["panels"].([]any); ok {
			dashboardPanels(inner, f)
		}
	}
}

// The dashboard is a Grafana dashboard that works both ways it is used:
// provisioned (deploy/grafana: ${DS_PROMETHEUS} resolves to its data
// source variable) and imported by hand (Grafana asks for the
// DS_PROMETHEUS input and writes it in). Every panel reads that data
// source, has a unique id, sits inside the 24-column grid without
// overlapping another, has queries that Prometheus parses (promtool), and
// the panels the operations issue asks for are there.
func TestTheDashboardIsWellFormedForImportAndProvisioning(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("grafana/dashboards/stepcollect.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	for _, k := range []string{"title", "uid", "schemaVersion", "panels", "templating", "__inputs"} {
		if dash[k] == nil {
			t.Errorf("dashboard has no %q", k)
		}
	}
	if dash["uid"] != "stepcollect" {
		t.Errorf("uid %v: links and the provisioned home dashboard use stepcollect", dash["uid"])
	}
	inputs, _ := dash["__inputs"].([]any)
	if len(inputs) != 1 || fmt.Sprint(inputs[0].(map[string]any)["name"]) != "DS_PROMETHEUS" ||
		inputs[0].(map[string]any)["type"] != "datasource" || inputs[0].(map[string]any)["pluginId"] != "prometheus" {
		t.Errorf("__inputs %v: want one datasource input DS_PROMETHEUS of plugin prometheus", inputs)
	}
	var dsVar map[string]any
	tmpl, _ := dash["templating"].(map[string]any)
	vars, _ := tmpl["list"].([]any)
	for _, v := range vars {
		if m := v.(map[string]any); m["type"] == "datasource" {
			dsVar = m
		}
	}
	if dsVar == nil || dsVar["name"] != "DS_PROMETHEUS" || dsVar["query"] != "prometheus" {
		t.Errorf("templating: %v; want a datasource variable named DS_PROMETHEUS over prometheus, so that ${DS_PROMETHEUS} resolves when provisioned", vars)
	}

	wantDS := map[string]any{"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
	ids := map[float64]string{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	var exprs []string
	var exprPanels []string
	panels, _ := dash["panels"].([]any)
	dashboardPanels(panels, func(p map[string]any) {
		title := fmt.Sprint(p["title"])
		id, _ := p["id"].(float64)
		if other, dup := ids[id]; dup || id == 0 {
			t.Errorf("panel %q: id %v missing or also %q's", title, p["id"], other)
		}
		ids[id] = title
		g, _ := p["gridPos"].(map[string]any)
		x, y, w, h := int(g["x"].(float64)), int(g["y"].(float64)), int(g["w"].(float64)), int(g["h"].(float64))
		if w < 1 || h < 1 || x < 0 || x+w > 24 {
			t.Errorf("panel %q: gridPos %v outside the 24-column grid", title, g)
		}
		for i := x; i < x+w; i++ {
			for j := y; j < y+h; j++ {
				if other, ok := taken[cell{i, j}]; ok {
					t.Errorf("panel %q overlaps %q at %d,%d", title, other, i, j)
					return
				}
				taken[cell{i, j}] = title
			}
		}
		if p["type"] == "row" {
			return
		}
		if !reflect.DeepEqual(p["datasource"], wantDS) {
			t.Errorf("panel %q: datasource %v, want %v", title, p["datasource"], wantDS)
		}
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no query", title)
		}
		refs := map[string]bool{}
		for _, x := range targets {
			tg := x.(map[string]any)
			ref := fmt.Sprint(tg["refId"])
			if refs[ref] {
				t.Errorf("panel %q: refId %s twice", title, ref)
			}
			refs[ref] = true
			if ds, ok := tg["datasource"]; ok && !reflect.DeepEqual(ds, wantDS) {
				t.Errorf("panel %q query %s: datasource %v, want %v", title, ref, ds, wantDS)
			}
			expr, _ := tg["expr"].(string)
			if strings.TrimSpace(expr) == "" {
				t.Errorf("panel %q query %s has no expr", title, ref)
			}
			exprs = append(exprs, expr)
			exprPanels = append(exprPanels, title)
		}
	})
	// no data source is named any other way anywhere in the file
	if n, m := strings.Count(string(b), `"uid": "${DS_PROMETHEUS}"`), regexp.MustCompile(`"uid": "[^"]*"`).FindAllString(string(b), -1); n != len(m)-1 {
		t.Errorf("%d uids, %d of them ${DS_PROMETHEUS}; only the dashboard's own uid may differ: %v", len(m), n, m)
	}

	all := strings.Join(exprs, "\n")
	for _, want := range []string{`asynq_tasks{state="pending"}`, `asynq_tasks{state="active"}`, `asynq_tasks{state="retry"}`, `asynq_tasks{state="archived"}`,
		"go_sql_in_use_connections", "go_sql_idle_connections", "go_sql_wait_count_total",
		"stepcollect_outbox_oldest_event_age_seconds", "stepcollect_last_sweep_age_seconds", "stepcollect_redis_up", "stepcollect_mysql_up",
		"stepcollect_build_info",
		// what an operator must act on: held events, paused delivery, steps set aside
		"max(stepcollect_outbox_held)", "max(stepcollect_delivery_paused)", "max(stepcollect_set_aside_events)", "stepcollect_events_set_aside_total"} {
		if !strings.Contains(all, want) {
			t.Errorf("no panel queries %s", want)
		}
	}

	// The gauges metrics.StateCollector reads from MySQL are the same
	// database-wide figure on every replica: a panel takes their max (or
	// min), never their sum, which would count them once per replica.
	src, err := os.ReadFile("../metrics/state.go")
	if err != nil {
		t.Fatal(err)
	}
	var shared []string
	for _, m := range regexp.MustCompile(`\bd\("([a-z_]+)",`).FindAllStringSubmatch(string(src), -1) {
		shared = append(shared, "stepcollect_"+m[1])
	}
	if !slices.Contains(shared, "stepcollect_outbox_held") || !slices.Contains(shared, "stepcollect_delivery_paused") {
		t.Fatalf("database-wide gauges found in metrics/state.go: %v; the extraction is broken", shared)
	}
	for i, e := range exprs {
		for _, g := range shared {
			uses := regexp.MustCompile(`\b`+g+`\b`).FindAllStringIndex(e, -1)
			aggregated := regexp.MustCompile(`\b(max|min)(\s+by\s*\([^)]*\))?\s*\(\s*`+g+`\b`).FindAllStringIndex(e, -1)
			if len(uses) != len(aggregated) {
				t.Errorf("panel %q: %s: %s is served alike by every replica; aggregate it with max or min", exprPanels[i], e, g)
			}
		}
	}

	// promtool parses every query: as recording rules of a scratch file
	var rules strings.Builder
	rules.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, e := range exprs {
		q, _ := json.Marshal(e)
		fmt.Fprintf(&rules, "      - record: dashboard:query_%d\n        expr: %s\n", i, q)
	}
	path := filepath.Join(t.TempDir(), "dashboard.yml")
	if err := os.WriteFile(path, []byte(rules.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(requirePromtool(t), "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool rejects a dashboard query: %v\n%s", err, out)
		for i, e := range exprs {
			t.Logf("query_%d (%s): %s", i, exprPanels[i], e)
		}
	}
}
