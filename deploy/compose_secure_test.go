package deploy_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// interpolation is one ${NAME…} of a compose file: ${NAME}, ${NAME:-default}
// (or -default), ${NAME:?message} (or ?message).
var interpolation = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}`)

// resolve is s as docker compose reads it with nothing set: defaults taken,
// a required variable reported with its message.
func resolve(s string) (value string, required map[string]string) {
	required = map[string]string{}
	value = interpolation.ReplaceAllStringFunc(s, func(m string) string {
		p := interpolation.FindStringSubmatch(m)
		switch strings.TrimPrefix(p[2], ":") {
		case "-":
			return p[3]
		case "?":
			required[p[1]] = p[3]
		}
		return ""
	})
	return value, required
}

// Secret settings have no default: each is a required variable whose
// message names it.
var requiredSecrets = map[string][2]string{ // service: variable the setting is, in compose
	"STEPCOLLECT_API_KEY":          {"api", "STEPCOLLECT_API_KEY"},
	"STEPCOLLECT_WEBHOOK_HMAC_KEY": {"api", "STEPCOLLECT_WEBHOOK_HMAC_KEY"},
	"GF_SECURITY_ADMIN_PASSWORD":   {"grafana", "GRAFANA_ADMIN_PASSWORD"},
}

// The compose stack is closed by default: it refuses to start without the
// API key, the webhook HMAC key and a Grafana password (each a ${VAR:?…}
// naming what to set), no other key or password has a default of its own
// (the database's, reachable only inside the compose network, excepted),
// every published port is on 127.0.0.1 unless STEPCOLLECT_PUBLISH_ADDR says
// otherwise, and Prometheus reads the api's /metrics on its own port, not
// on the webhook's.
func TestComposeIsClosedByDefault(t *testing.T) {
	t.Parallel()
	for _, file := range []string{"../docker-compose.yml", "../docker-compose.mysql.yml"} {
		services, _ := readCompose(t, file)
		for name, svc := range services {
			for k, v := range svc.env() {
				val, req := resolve(v)
				if want, ok := requiredSecrets[k]; ok && name == want[0] {
					if msg, ok := req[want[1]]; !ok || !strings.Contains(msg, want[1]) {
						t.Errorf("%s: %s %s=%q: want ${%s:?set %s to …}, refusing to start without it", file, name, k, v, want[1], want[1])
					}
					continue
				}
				secret := regexp.MustCompile(`KEY|PASSWORD|SECRET|TOKEN`).MatchString(k)
				if secret && val != "" && name != "mysql" {
					t.Errorf("%s: %s %s defaults to %q", file, name, k, val)
				}
			}
			for _, p := range svc.strs("ports") {
				val, _ := resolve(p)
				if !strings.HasPrefix(val, "127.0.0.1:") || !strings.Contains(p, "${STEPCOLLECT_PUBLISH_ADDR") {
					t.Errorf("%s: %s publishes %q (%q with nothing set): want ${STEPCOLLECT_PUBLISH_ADDR:-127.0.0.1}:…", file, name, p, val)
				}
			}
		}
		for want, where := range requiredSecrets {
			if file == "../docker-compose.yml" {
				if _, ok := services[where[0]].env()[want]; !ok {
					t.Errorf("%s: %s sets no %s", file, where[0], want)
				}
			}
		}
	}

	services, _ := readCompose(t, "../docker-compose.yml")
	api := services["api"].env()
	metrics, _ := resolve(api["STEPCOLLECT_API_METRICS_LISTEN"])
	listen, _ := resolve(api["STEPCOLLECT_LISTEN"])
	_, metricsPort, _ := strings.Cut(metrics, ":")
	_, listenPort, _ := strings.Cut(listen, ":")
	if metricsPort == "" || metricsPort == listenPort {
		t.Fatalf("api: STEPCOLLECT_API_METRICS_LISTEN=%q, STEPCOLLECT_LISTEN=%q: want /metrics on a port of its own", metrics, listen)
	}
	for _, p := range services["api"].strs("ports") {
		if strings.HasSuffix(p, ":"+metricsPort) {
			t.Errorf("api publishes its metrics port: %q", p)
		}
	}
	var prom struct {
		ScrapeConfigs []struct {
			JobName string `yaml:"job_name"`
			DNS     []struct {
				Port int `yaml:"port"`
			} `yaml:"dns_sd_configs"`
		} `yaml:"scrape_configs"`
	}
	b, err := os.ReadFile("prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &prom); err != nil {
		t.Fatal(err)
	}
	for _, sc := range prom.ScrapeConfigs {
		if sc.JobName == "api" && (len(sc.DNS) != 1 || fmt.Sprint(sc.DNS[0].Port) != metricsPort) {
			t.Errorf("prometheus scrapes the api on %+v, want port %s (its -metrics-listen)", sc.DNS, metricsPort)
		}
	}
}
