package version

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

func buildInfo(mainVersion string, settings ...string) func() (*debug.BuildInfo, bool) {
	return func() (*debug.BuildInfo, bool) {
		bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/stepcollect/stepcollect", Version: mainVersion}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi, true
	}
}

// What was stamped wins; without it, what the toolchain recorded; without
// that, Release and "unknown".
func TestStampedValuesWinAndTheToolchainsAreTheFallback(t *testing.T) {
	t.Parallel()
	const rev = "4f1c2d3e5a6b7c8d9e0f4f1c2d3e5a6b7c8d9e0f"
	for _, c := range []struct {
		name         string
		v, c, d      string
		read         func() (*debug.BuildInfo, bool)
		wantV, wantC string
		wantD        string
	}{
		{"stamped", "v0.3.0-2-gabc1234-dirty", "abc1234abc12", "2026-11-29T12:00:00Z", buildInfo("(devel)", "vcs.revision", rev),
			"v0.3.0-2-gabc1234-dirty", "abc1234abc12", "2026-11-29T12:00:00Z"},
		{"go build in a clean checkout", "", "", "", buildInfo("(devel)", "vcs.revision", rev, "vcs.modified", "false"),
			Release, "4f1c2d3e5a6b", "unknown"},
		{"go build in a modified checkout", "", "", "", buildInfo("(devel)", "vcs.revision", rev, "vcs.modified", "true"),
			Release, "4f1c2d3e5a6b-dirty", "unknown"},
		{"go install module@version", "", "", "", buildInfo("v0.3.0"), "v0.3.0", "unknown", "unknown"},
		{"go build of an untagged checkout", "", "", "", buildInfo("v0.0.0-20261201093000-4f1c2d3e5a6b+dirty", "vcs.revision", rev),
			Release, "4f1c2d3e5a6b", "unknown"},
		{"no build info", "", "", "", func() (*debug.BuildInfo, bool) { return nil, false }, Release, "unknown", "unknown"},
	} {
		t.Run(c.name, func(t *testing.T) {
			i := get(c.v, c.c, c.d, c.read)
			if i.Version != c.wantV || i.Commit != c.wantC || i.Date != c.wantD || i.GoVersion != runtime.Version() {
				t.Errorf("got %+v, want version %q commit %q date %q go %s", i, c.wantV, c.wantC, c.wantD, runtime.Version())
			}
		})
	}
	if got, want := (Info{"v1.2.3", "abc", "2026-11-29T12:00:00Z", "go1.26.8"}).Line("api"),
		"stepcollect api v1.2.3 (commit abc, built 2026-11-29T12:00:00Z, go1.26.8)"; got != want {
		t.Errorf("Line: %q, want %q", got, want)
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatal(err)
	}
	return root
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		t.Skipf("not a git checkout (git %s: %v)", strings.Join(args, " "), err)
	}
	return strings.TrimSpace(string(out))
}

// The environment a container or an operator's shell gives a binary,
// secrets included: -version must print its line and nothing else.
var secretEnv = []string{
	"STEPCOLLECT_API_KEY=s3cret", "STEPCOLLECT_WEBHOOK_HMAC_KEY=h", "STEPCOLLECT_CALLBACK_HMAC_KEY=c",
	"STEPCOLLECT_MYSQL_DSN=root:pw@tcp(127.0.0.1:3306)/x",
}

var line = regexp.MustCompile(`^stepcollect (api|worker|migrate) (\S+) \(commit (\S+), built (\S+), (go\S+)\)\n$`)

// `make build`'s own command line, run into a temporary directory: every
// binary it builds prints the version git describes, the commit and the
// build time through -version, and exits 0 before reading anything else
// (the DSN's database x does not exist, and no server is asked).
func TestMakeBuildStampsEveryBinarysVersion(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	root := moduleRoot(t)
	commit := git(t, root, "rev-parse", "--short=12", "HEAD")
	cmd := exec.Command("make", "-n", "--no-print-directory", "build")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n build: %v", err)
	}
	var goBuild string
	for _, l := range strings.Split(string(out), "\n") {
		if strings.Contains(l, " build ") && strings.Contains(l, "-o bin/ ") {
			goBuild = l
		}
	}
	if !strings.Contains(goBuild, "internal/version.commit=") {
		t.Fatalf("make build's go build line does not stamp the commit:\n%s", out)
	}
	dir := t.TempDir()
	goBuild = strings.Replace(goBuild, "-o bin/ ", "-o "+dir+"/ ", 1)
	start := time.Now().UTC().Truncate(time.Second)
	build := exec.Command("bash", "-c", goBuild)
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", goBuild, err, b)
	}
	for _, bin := range []string{"api", "worker", "migrate"} {
		run := exec.Command(filepath.Join(dir, bin), "-version")
		run.Env = append(os.Environ(), secretEnv...)
		var stderr strings.Builder
		run.Stderr = &stderr
		out, err := run.Output()
		if err != nil || stderr.Len() > 0 {
			t.Errorf("%s -version: %v, stderr %q", bin, err, stderr.String())
			continue
		}
		m := line.FindStringSubmatch(string(out))
		if m == nil {
			t.Errorf("%s -version: %q is not a version line", bin, out)
			continue
		}
		t.Logf("%s", strings.TrimSpace(string(out)))
		if m[1] != bin || m[2] != Release || m[3] != commit || m[5] != runtime.Version() {
			t.Errorf("%s -version: %q, want binary %s, version %s, commit %s, %s", bin, out, bin, Release, commit, runtime.Version())
		}
		built, err := time.Parse(time.RFC3339, m[4])
		if err != nil || built.Before(start.Add(-time.Minute)) || built.After(time.Now().Add(time.Minute)) {
			t.Errorf("%s -version: built %q, want the time of this build (%v)", bin, m[4], start)
		}
	}
}

// A plain go build (no ldflags) says the module version the toolchain
// recorded (a pseudo-version of the checkout, or "devel") and the commit it
// recorded (-buildvcs=true: this machine's GOFLAGS turns the recording off
// by default).
func TestAnUnstampedBuildSaysWhatTheToolchainRecorded(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("builds a binary")
	}
	root := moduleRoot(t)
	commit := git(t, root, "rev-parse", "--short=12", "HEAD")
	bin := filepath.Join(t.TempDir(), "migrate")
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/migrate")
	build.Dir = root
	if b, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	info, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	modVersion := ""
	for _, l := range strings.Split(string(info), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/stepcollect/stepcollect" {
			modVersion = f[2]
		}
	}
	want := modVersion
	if want == "(devel)" || want == "" || pseudoVersion.MatchString(want) {
		want = Release
	}
	out, err := exec.Command(bin, "-version").Output()
	m := line.FindStringSubmatch(string(out))
	if err != nil || m == nil {
		t.Fatalf("migrate -version: %q, %v", out, err)
	}
	t.Logf("%s", strings.TrimSpace(string(out)))
	if m[2] != want || strings.TrimSuffix(m[3], "-dirty") != commit || m[4] != "unknown" {
		t.Errorf("migrate -version: %q, want %s, commit %s[-dirty], built unknown", out, want, commit)
	}
}
