// Package version says which build of stepcollect is running: every
// binary's -version line and the stepcollect_build_info metric.
//
// The values are stamped at build time (the Makefile's build and
// bench-build, the Dockerfile):
//
//	go build -ldflags "-X github.com/stepcollect/stepcollect/internal/version.commit=$(git rev-parse --short=12 HEAD) \
//	  -X github.com/stepcollect/stepcollect/internal/version.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
//
// The version is Release unless a build stamps another (a packager's own)
// or the toolchain recorded a release tag (go install module@v1.2.3). A
// build without stamps (go build, go run, go test) takes the commit from
// vcs.revision (with -dirty when vcs.modified), else "unknown"; the build
// time is then "unknown".
package version

import (
	"fmt"
	"regexp"
	"runtime"
	"runtime/debug"
)

// Release is this source tree's version, as CHANGELOG.md lists it. Raise it
// with the changelog's new heading.
const Release = "v0.1.0"

// pseudoVersion matches what go build derives from a checkout without a
// tag (v0.0.0-20261201093000-abcdef123456, +dirty): not a release.
var pseudoVersion = regexp.MustCompile(`\d{14}-[0-9a-f]{12}(\+dirty)?$`)

// Set with -ldflags -X; empty when not stamped.
var (
	version string
	commit  string
	date    string
)

// Info is one build's identity.
type Info struct {
	Version   string // Release, or what the build stamped
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
			if v := bi.Main.Version; i.Version == "" && v != "" && v != "(devel)" && !pseudoVersion.MatchString(v) {
				i.Version = v // go install …@v1.2.3
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
		i.Version = Release
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
//	stepcollect api v0.1.0 (commit 4f1c2d3e5a6b, built 2026-11-29T12:00:00Z, go1.26.8)
func (i Info) Line(binary string) string {
	return fmt.Sprintf("stepcollect %s %s (commit %s, built %s, %s)", binary, i.Version, i.Commit, i.Date, i.GoVersion)
}

// Line is Get().Line(binary).
func Line(binary string) string { return Get().Line(binary) }
