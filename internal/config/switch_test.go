package config_test

import (
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/internal/version"
)

// -version answers before any value is looked at (a bad environment, a
// DSN that names no database), and a binary that handles only -h prints
// the version through Usage: the migrate tool does.
func TestVersionAnswersBeforeAnyCheckAndUsageWritesIt(t *testing.T) {
	t.Parallel()
	s := config.New("migrate", env(map[string]string{"T_N": "many", "T_DSN": "root@tcp(db:3306)/"}))
	s.Int("n", "T_N", 1, "")
	dsn := s.DSN("mysql-dsn", "T_DSN", config.DefaultMySQLDSN, "")
	s.Check(config.MySQLDSN("mysql-dsn", dsn))
	err := s.Parse([]string{"-version"})
	if !config.IsVersion(err) || !config.IsHelp(err) {
		t.Fatalf("-version: %v; want IsVersion and IsHelp", err)
	}
	var out strings.Builder
	s.Usage(&out)
	if want := version.Line("migrate") + "\n"; out.String() != want {
		t.Errorf("Usage after -version: %q, want %q", out.String(), want)
	}

	// and -h is still the flags, -version among them
	s = config.New("api", env(nil))
	if err := s.Parse([]string{"-h"}); !config.IsHelp(err) || config.IsVersion(err) {
		t.Fatalf("-h: %v", err)
	}
	out.Reset()
	s.Usage(&out)
	if !strings.Contains(out.String(), "Usage of api:") || !strings.Contains(out.String(), "-version") {
		t.Errorf("-h:\n%s", out.String())
	}
}

// A Switch takes no environment (STEPCOLLECT_PROBE=true left in a
// container's environment must not turn the service into a probe), and
// Lookup reads any flag's value after Parse.
func TestASwitchIgnoresTheEnvironmentAndLookupReadsValues(t *testing.T) {
	t.Parallel()
	s := config.New("t", env(map[string]string{"probe": "true", "PROBE": "true", "T_LISTEN": "0.0.0.0:9100"}))
	probe := s.Switch("probe", "probe and exit")
	s.String("listen", "T_LISTEN", "127.0.0.1:1", "")
	if err := s.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if *probe {
		t.Error("a Switch was set by the environment")
	}
	if v, ok := s.Lookup("probe"); !ok || v != "false" {
		t.Errorf("Lookup(probe) = %q, %v", v, ok)
	}
	if v, ok := s.Lookup("listen"); !ok || v != "0.0.0.0:9100" {
		t.Errorf("Lookup(listen) = %q, %v", v, ok)
	}
	if _, ok := s.Lookup("metrics-listen"); ok {
		t.Error("Lookup found a flag the Set does not define")
	}
	s = config.New("t", env(nil))
	probe = s.Switch("probe", "")
	if err := s.Parse([]string{"-probe"}); err != nil || !*probe {
		t.Errorf("-probe: %v, set %v", err, *probe)
	}
}
