package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// The api and the worker take the one pool policy every stepcollect binary
// has (storage/mysql.Pool, cmd/nanocmd's test has its own): the bound shows
// in go_sql_max_open_connections, and connections are closed for age with
// -mysql-conn-max-lifetime, for idleness with -mysql-conn-max-idle-time.
func TestThePoolFlagsSetTheAPIsAndTheWorkersPool(t *testing.T) {
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	for _, tc := range []struct{ lifetime, idle, metric string }{
		{"1s", "0", "go_sql_max_lifetime_closed_total"},
		{"0", "500ms", "go_sql_max_idle_time_closed_total"},
	} {
		env := testkit.ServiceEnv(db.DSN, rs.URL, "STEPCOLLECT_LOG_LEVEL=warn", "STEPCOLLECT_API_KEY="+apiKey, "STEPCOLLECT_MYSQL_MAX_CONNS=7",
			"STEPCOLLECT_MYSQL_CONN_MAX_LIFETIME="+tc.lifetime, "STEPCOLLECT_MYSQL_CONN_MAX_IDLE_TIME="+tc.idle)
		for _, bin := range []struct{ name, addrFlag string }{{"api", "listen"}, {"worker", "metrics-listen"}} {
			t.Run(bin.name+"/"+tc.metric, func(t *testing.T) {
				p, url := testkit.StartService(t, testkit.Services()[bin.name], env, bin.addrFlag)
				defer p.Stop()
				testkit.WaitUntil(t, 30*time.Second, tc.metric+" above 0 and 7 connections at most", func() (bool, any) {
					fams, err := scrape.Families(url + "/metrics")
					if err != nil {
						return false, err
					}
					open, closed := scrape.Value(fams, "go_sql_max_open_connections"), scrape.Value(fams, tc.metric)
					return open == 7 && closed > 0, fmt.Sprintf("max open %v, %s %v", open, tc.metric, closed)
				})
			})
		}
	}
}
