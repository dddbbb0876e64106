package app

import (
	"runtime/debug"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
)

// restoreGC puts the test process's collector back as it was.
func restoreGC(t *testing.T) {
	percent, limit := gcSettings()
	t.Cleanup(func() {
		debug.SetGCPercent(int(percent))
		debug.SetMemoryLimit(int64(limit))
	})
}

func TestTuneGCSetsTheTargetAndTheLimit(t *testing.T) {
	restoreGC(t)
	debug.SetGCPercent(100)
	debug.SetMemoryLimit(1 << 62)
	tuneGC(func(string) string { return "" }, 300<<20, zerolog.Nop())
	if percent, limit := gcSettings(); percent != gcPercent || limit != 300<<20 {
		t.Fatalf("GOGC %d, GOMEMLIMIT %d; want %d and %d", percent, limit, gcPercent, 300<<20)
	}
}

func TestTuneGCLeavesWhatTheOperatorSet(t *testing.T) {
	restoreGC(t)
	// as the runtime would have set them from the environment
	debug.SetGCPercent(150)
	debug.SetMemoryLimit(900 << 20)
	env := map[string]string{"GOGC": "150", "GOMEMLIMIT": "900MiB"}
	tuneGC(func(k string) string { return env[k] }, 300<<20, zerolog.Nop())
	if percent, limit := gcSettings(); percent != 150 || limit != 900<<20 {
		t.Fatalf("GOGC %d, GOMEMLIMIT %d; want the operator's 150 and %d", percent, limit, 900<<20)
	}
}

// The api's limit follows its body budget: the raised target never lets it
// hold more than the budget and the rest of the process.
func TestTheAPIsMemoryLimitFollowsTheBodyBudget(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		maxBody, inflight, want int64
	}{
		{0, 0, httpapi.DefaultMaxInflightBodyBytes + 128<<20},
		{0, 16 << 20, httpapi.DefaultMaxBody + 128<<20}, // at least one largest body
		{1 << 20, 32 << 20, 32<<20 + 128<<20},
	} {
		if got := apiMemoryLimit(httpapi.BodyBudget(c.maxBody, c.inflight)); got != c.want {
			t.Errorf("-max-body-bytes %d -max-inflight-body-bytes %d: limit %d, want %d", c.maxBody, c.inflight, got, c.want)
		}
	}
}
