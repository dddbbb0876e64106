package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/nanocmdapp"
)

// flagHelp is one flag of a -h output: its type, usage with the
// environment variable envflag appends, and default.
type flagHelp struct{ typ, usage, def string }

var (
	helpName    = regexp.MustCompile(`^  -(\S+)(?: (\S+))?$`)
	helpDefault = regexp.MustCompile(`^(.*?)(?: \(default (.*)\))?$`)
)

func parseHelp(t *testing.T, bin string) map[string]flagHelp {
	t.Helper()
	cmd := exec.Command(bin, "-h")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NANOCMD_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	out, _ := cmd.CombinedOutput() // flag's -h exits 0 or 2 by binary
	flags := map[string]flagHelp{}
	var cur string
	for _, l := range strings.Split(string(out), "\n") {
		if m := helpName.FindStringSubmatch(l); m != nil {
			cur = m[1]
			flags[cur] = flagHelp{typ: m[2]}
		} else if cur != "" && strings.HasPrefix(l, "    \t") {
			m := helpDefault.FindStringSubmatch(strings.TrimPrefix(l, "    \t"))
			f := flags[cur]
			f.usage, f.def = m[1], m[2]
			flags[cur] = f
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%s -h: no flags in\n%s", bin, out)
	}
	return flags
}

// buildNanoCMD builds NanoCMD v0.7.1's own cmd/nanocmd from the bench
// module, which requires it (as the Makefile's bench-build does).
func buildNanoCMD(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../../bench")
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "nanocmd-v0.7.1")
	cmd := exec.Command("go", "build", "-o", bin, "github.com/micromdm/nanocmd/cmd/nanocmd")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building NanoCMD v0.7.1 in bench/: %v\n%s", err, out)
	}
	return bin
}

// Every flag of NanoCMD v0.7.1's server is accepted with the same type,
// usage, NANOCMD_ variable and default; the additions are only the ones
// named here.
func TestEveryFlagOfNanoCMDv071IsAcceptedWithTheSameDefault(t *testing.T) {
	theirs := parseHelp(t, buildNanoCMD(t))
	ours := parseHelp(t, bins["nanocmd"])
	for name, f := range theirs {
		if got, ok := ours[name]; !ok {
			t.Errorf("-%s of NanoCMD v0.7.1 is missing", name)
		} else if got != f {
			t.Errorf("-%s: %+v, NanoCMD v0.7.1 has %+v", name, got, f)
		}
	}
	additions := map[string]bool{"webhook-hmac-key": true, "sweep-interval": true, "redis-url": true, "enqueue-max-url-bytes": true,
		"mysql-max-conns": true, "mysql-conn-max-lifetime": true, "mysql-conn-max-idle-time": true}
	for name := range ours {
		if _, ok := theirs[name]; !ok && !additions[name] {
			t.Errorf("-%s is neither NanoCMD v0.7.1's nor a named addition", name)
		}
	}
	if len(theirs) < 15 {
		t.Errorf("read %d flags of NanoCMD v0.7.1, want its 15", len(theirs))
	}
}

// The environment sets every flag but -version, as NanoCMD's envflag does,
// and the command line wins over it.
func TestNANOCMDVariablesSetTheFlagsAndTheCommandLineWins(t *testing.T) {
	env := []string{"NANOCMD_LISTEN=:1234", "NANOCMD_STORAGE=mysql", "NANOCMD_WORKER_INTERVAL=7",
		"NANOCMD_WEBHOOK_HMAC_KEY=k", "NANOCMD_DEBUG=true", "NANOCMD_VERSION=true"}
	cfg, err := nanocmdapp.Parse("nanocmd", []string{"-storage", "inmem"}, env, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != ":1234" || cfg.Storage != "inmem" || cfg.WorkerInterval != 7 || cfg.WebhookHMACKey != "k" || !cfg.Debug || cfg.Version {
		t.Errorf("parsed %+v", cfg)
	}
}
