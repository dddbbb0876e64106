package app

import (
	"os"
	"runtime/debug"
	"runtime/metrics"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
)

// TuneAPIGC sets the api process's garbage collector (cmd/api, before
// NewAPI; not NewAPI itself, which tests call in a process of their own).
func TuneAPIGC(cfg APIConfig, logger zerolog.Logger) {
	tuneGC(os.Getenv, apiMemoryLimit(httpapi.BodyBudget(cfg.MaxBodyBytes, cfg.MaxInflightBodyBytes)), logger)
}

// TuneWorkerGC sets the worker process's garbage collector (cmd/worker).
func TuneWorkerGC(logger zerolog.Logger) {
	tuneGC(os.Getenv, workerMemoryLimit, logger)
}

// gcPercent is the garbage collector's target in both binaries unless
// GOGC is set. Their live heap is a few MiB (a connection pool, the
// metrics, the requests and events in flight), and at Go's default of 100
// a heap of a few MiB is collected every few MiB allocated: at 2,500
// webhooks a second, many times a second, each collection also shrinking
// the stacks of idle connection goroutines that the next request grows
// again. At 400 the api and the worker each spent 5 to 22% less CPU in the
// service row at N=10000 (docs/bench/gc-2026-12-03).
const gcPercent = 400

// workerMemoryLimit is the worker's soft memory limit unless GOMEMLIMIT is
// set: the collector keeps its heap under it whatever gcPercent allows.
// A worker whose live heap is under half of it never uses more than it
// would at GOGC=100 and 256 MiB; one whose live heap is larger is
// collected more often than at GOGC=100, never less.
const workerMemoryLimit = 256 << 20

// apiMemoryLimit is the api's soft memory limit unless GOMEMLIMIT is set:
// its body budget (which counts the bodies' working memory) and 128 MiB
// for the rest, so that the raised target applies while the live heap is
// small and, with the budget full, the api holds no more than it did at
// GOGC=100 (TestConcurrentLargeResultsStayWithinTheBodyBudget: 64 bodies of
// 24 MiB at once).
func apiMemoryLimit(bodyBudget int64) int64 {
	return bodyBudget + 128<<20
}

// tuneGC sets the collector's target and soft memory limit, each unless
// the operator set it (GOGC, GOMEMLIMIT), and logs what is in force.
func tuneGC(getenv func(string) string, limit int64, logger zerolog.Logger) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(limit)
	}
	percent, limitNow := gcSettings()
	logger.Info().Uint64("gc_percent", percent).Uint64("memory_limit_bytes", limitNow).
		Msg("garbage collector: target and soft memory limit (GOGC and GOMEMLIMIT set them instead)")
}

// gcSettings is the collector's target and soft memory limit in force.
func gcSettings() (percent, limit uint64) {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64(), s[1].Value.Uint64()
}
