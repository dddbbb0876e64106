package metrics_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
)

func TestStorageMetricsCountWhatTheStorageReports(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewPedanticRegistry()
	m := metrics.NewStorage(reg)

	m.TxRetried("store command result", "deadlock")
	m.TxRetried("store command result", "deadlock")
	m.ResultCommitted(3*time.Millisecond, true, nil)
	m.StepsCollected(storage.CollectResult{storage.CollectCollected: 2, storage.CollectReferenced: 5},
		[]time.Time{time.Now().Add(-2 * time.Second), time.Now().Add(-4 * time.Second)})

	if got := testutil.ToFloat64(m.TxRetries.WithLabelValues("store command result", "deadlock")); got != 2 {
		t.Errorf("retries %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.StepsCollectedTotal); got != 2 {
		t.Errorf("collected %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.CollectRuns.WithLabelValues("referenced")); got != 5 {
		t.Errorf("referenced runs %v, want 5", got)
	}
	if got := testutil.ToFloat64(m.CollectRuns.WithLabelValues("gone")); got != 0 {
		t.Errorf("gone runs %v, want a zero series", got)
	}
	var lag dto.Metric
	if err := m.CollectionLag.Write(&lag); err != nil {
		t.Fatal(err)
	}
	if h := lag.GetHistogram(); h.GetSampleCount() != 2 || h.GetSampleSum() < 6 || h.GetSampleSum() > 7 {
		t.Errorf("lag histogram: %d samples summing %.2fs, want 2 summing about 6s", h.GetSampleCount(), h.GetSampleSum())
	}
	names := []string{"stepcollect_result_commit_seconds", "stepcollect_tx_retries_total", "stepcollect_steps_collected_total",
		"stepcollect_collect_runs_total", "stepcollect_collection_lag_seconds"}
	if n, err := testutil.GatherAndCount(reg, names...); err != nil || n == 0 {
		t.Errorf("gathered %d series of %v: %v", n, names, err)
	}
}
