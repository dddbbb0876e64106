package metrics_test

import (
	"database/sql"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/metrics"
)

// Both binaries' sets carry stepcollect_build_info = 1 with this build's
// version, commit and Go version, the values -version prints.
func TestTheSetExportsBuildInfo(t *testing.T) {
	t.Parallel()
	s := metrics.New(nil, nil)
	fams, err := s.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	v := version.Get()
	for _, f := range fams {
		if f.GetName() != "stepcollect_build_info" {
			continue
		}
		if len(f.GetMetric()) != 1 {
			t.Fatalf("stepcollect_build_info has %d series, want 1", len(f.GetMetric()))
		}
		m := f.GetMetric()[0]
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if got["version"] != v.Version || got["commit"] != v.Commit || got["go_version"] != v.GoVersion || len(got) != 3 || m.GetGauge().GetValue() != 1 {
			t.Errorf("stepcollect_build_info %v = %v; want %+v = 1", got, m.GetGauge().GetValue(), v)
		}
		return
	}
	t.Fatal("stepcollect_build_info is not registered")
}

// RegisterDB exports the pool's go_sql_* statistics under db_name
// stepcollect (read at scrape time: no connection is needed to gather).
func TestRegisterDBExportsThePool(t *testing.T) {
	t.Parallel()
	db, err := sql.Open("mysql", "u:p@tcp(127.0.0.1:1)/x")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(7)
	s := metrics.New(nil, nil)
	s.RegisterDB(db)
	for _, name := range []string{"go_sql_max_open_connections", "go_sql_open_connections", "go_sql_in_use_connections",
		"go_sql_idle_connections", "go_sql_wait_count_total", "go_sql_wait_duration_seconds_total"} {
		if n, err := testutil.GatherAndCount(s.Registry, name); err != nil || n != 1 {
			t.Errorf("%s: %d series, %v; want 1", name, n, err)
		}
	}
	fams, _ := s.Registry.Gather()
	for _, f := range fams {
		if f.GetName() == "go_sql_max_open_connections" {
			m := f.GetMetric()[0]
			if m.GetLabel()[0].GetValue() != metrics.DBPoolName || m.GetGauge().GetValue() != 7 {
				t.Errorf("go_sql_max_open_connections %v = %v; want db_name %s = 7", m.GetLabel(), m.GetGauge().GetValue(), metrics.DBPoolName)
			}
		}
	}
}
