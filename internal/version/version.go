// Package version says which build of stepcollect is running: every
// binary's -version line and the stepcollect_build_info metric.
//
// The values are stamped at build time (the Makefile's build and
// bench-build, the Dockerfile):
//
//	go build -ldflags "-X github.com/stepcollect/stepcollect/internal/version.version=$(git describe --always --dirty) \
//	  -X github.com/stepcollect/stepcollect/internal/version.commit=$(git rev-parse --short=12 HEAD) \
//	  -X github.com/stepcollect/stepcollect/internal/version.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
//
// A build without them (go build, go run, go test) falls back to what the
// Go toolchain recorded (runtime/debug.ReadBuildInfo): the main module's
// version (the tag of go install module@version, or the pseudo-version go
// build derives from the checkout), else "devel"; the commit from
// vcs.revision (with -dirty when vcs.modified), else "unknown"; the build
// time is then "unknown".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags -X; empty when not stamped.
var (
	version string
	commit  string
	date    string
)

// Info is one build's identity.
type Info struct {
	Version   string // git describe --always --dirty, or "devel"
	Commit    string // abbreviated commit, or "unknown"
	Date      string // build time (RFC 3339, UTC), or "unknown"
	GoVersion string // runtime.Version()
}

// Get returns this binary's Info.
func Get() Info {
	return get(version, commit, date, debug.ReadBuildInfo)
}

func get(v, c, d string, read func() (*debug.BuildInfo, bool)) Info {
	i := Info{Version: v, Commit: c, Date: d, GoVersion: runtime.Version()}
	if i.Version == "" || i.Commit == "" {
		if bi, ok := read(); ok {
			if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
				i.Version = bi.Main.Version // go install …@v1.2.3, or a checkout's pseudo-version
			}
			if i.Commit == "" {
				var rev string
				var modified bool
				for _, s := range bi.Settings {
					switch s.Key {
					case "vcs.revision":
						rev = s.Value
					case "vcs.modified":
						modified = s.Value == "true"
					}
				}
				if len(rev) > 12 {
					rev = rev[:12]
				}
				if rev != "" && modified {
					rev += "-dirty"
				}
				i.Commit = rev
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	if i.Commit == "" {
		i.Commit = "unknown"
	}
	if i.Date == "" {
		i.Date = "unknown"
	}
	return i
}

// Line is the -version line of binary (api, worker, migrate):
//
//	stepcollect api v0.3.0 (commit 4f1c2d3e5a6b, built 2026-11-29T12:00:00Z, go1.26.8)
func (i Info) Line(binary string) string {
	return fmt.Sprintf("stepcollect %s %s (commit %s, built %s, %s)", binary, i.Version, i.Commit, i.Date, i.GoVersion)
}

// Line is Get().Line(binary).
func Line(binary string) string { return Get().Line(binary) }
