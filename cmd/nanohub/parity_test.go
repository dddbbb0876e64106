package main_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/nanohubapp"
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
		if !strings.HasPrefix(kv, "NANOHUB_") {
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

// buildNanoHUB builds NanoHUB v0.2.0's own cmd/nanohub as its release
// does: `go install …@v0.2.0` builds with NanoHUB's own go.mod (NanoCMD
// v0.7.0, whose MySQL storage differs from v0.7.1's), not this module's.
func buildNanoHUB(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("go", "install", "github.com/micromdm/nanohub/cmd/nanohub@v0.2.0")
	cmd.Dir = dir // outside this module
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building NanoHUB v0.2.0: %v\n%s", err, out)
	}
	return filepath.Join(dir, "nanohub")
}

// Every flag of NanoHUB v0.2.0's server is accepted with the same type,
// usage, NANOHUB_ variable and default; the only addition is named here.
func TestEveryFlagOfNanoHUBv020IsAcceptedWithTheSameDefault(t *testing.T) {
	theirs := parseHelp(t, buildNanoHUB(t))
	ours := parseHelp(t, bins["nanohub"])
	for name, f := range theirs {
		if got, ok := ours[name]; !ok {
			t.Errorf("-%s of NanoHUB v0.2.0 is missing", name)
		} else if got != f {
			t.Errorf("-%s: %+v, NanoHUB v0.2.0 has %+v", name, got, f)
		}
	}
	additions := map[string]bool{"sweep-interval": true, "mysql-max-conns": true, "mysql-conn-max-lifetime": true, "mysql-conn-max-idle-time": true}
	for name := range ours {
		if _, ok := theirs[name]; !ok && !additions[name] {
			t.Errorf("-%s is neither NanoHUB v0.2.0's nor a named addition", name)
		}
	}
	if len(theirs) != 20 {
		t.Errorf("read %d flags of NanoHUB v0.2.0, want its 20", len(theirs))
	}
}

// The environment sets every flag but -version, as NanoHUB's envflag does,
// and the command line wins over it.
func TestNANOHUBVariablesSetTheFlagsAndTheCommandLineWins(t *testing.T) {
	env := []string{"NANOHUB_LISTEN=:1234", "NANOHUB_STORAGE=mysql", "NANOHUB_WORKER_INTERVAL=7",
		"NANOHUB_CERT_HEADER=X-Cert", "NANOHUB_DEBUG=true", "NANOHUB_VERSION=true", "NANOHUB_API_KEY=k"}
	cfg, err := nanohubapp.Parse("nanohub", []string{"-storage", "inmem"}, env, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != ":1234" || cfg.Storage != "inmem" || cfg.WorkerInterval != 7 || cfg.CertHeader != "X-Cert" ||
		!cfg.Debug || cfg.Version || cfg.APIKey != "k" {
		t.Errorf("parsed %+v", cfg)
	}
}
