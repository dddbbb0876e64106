package main_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// nanocmd takes the pool flags every stepcollect binary takes (their one
// policy is storage/mysql.Pool): the bound shows in
// go_sql_max_open_connections, and connections are closed for age with
// one flag, for idleness with the other.
func TestThePoolFlagsSetNanocmdsPool(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ lifetime, idle, metric string }{
		{"1s", "0", "go_sql_max_lifetime_closed_total"},
		{"0", "500ms", "go_sql_max_idle_time_closed_total"},
	} {
		t.Run(tc.metric, func(t *testing.T) {
			t.Parallel()
			db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
			s := startMySQL(t, db, "-mysql-max-conns", "7", "-mysql-conn-max-lifetime", tc.lifetime, "-mysql-conn-max-idle-time", tc.idle)
			testkit.WaitUntil(t, 30*time.Second, tc.metric+" above 0 and 7 connections at most", func() (bool, any) {
				s.do(t, "GET", "/readyz", false) // a connection taken and given back
				fams, err := scrape.Families(s.base + "/metrics")
				if err != nil {
					return false, err
				}
				open, closed := scrape.Value(fams, "go_sql_max_open_connections"), scrape.Value(fams, tc.metric)
				return open == 7 && closed > 0, fmt.Sprintf("max open %v, %s %v", open, tc.metric, closed)
			})
		})
	}
}
