package main_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// cluster is one or more replicas of the binary on one database, their
// commands enqueued to one fake NanoMDM, reached at one URL: the replica
// itself, or a round-robin reverse proxy in front of them (each request to
// the next replica, as a load balancer does), for NanoMDM's webhook and
// for the API alike.
type cluster struct {
	t     *testing.T // the test the replicas live as long as
	db    *testkit.DB
	mdm   *fakeNanoMDM
	bin   string
	args  [][]string
	addrs []string // replica i's -listen
	procs []*testkit.Proc
	base  string
}

// startCluster runs n replicas with -storage mysql on db and extra flags.
func startCluster(t *testing.T, db *testkit.DB, n int, extra ...string) *cluster {
	t.Helper()
	return startClusterOn(t, db, startFakeNanoMDM(t, enqueueKey), n, extra...)
}

// startClusterOn is startCluster with the commands enqueued to mdm.
func startClusterOn(t *testing.T, db *testkit.DB, mdm *fakeNanoMDM, n int, extra ...string) *cluster {
	t.Helper()
	c := startReplicas(t, db, mdm.URL, enqueueKey, n, extra...)
	c.mdm = mdm
	return c
}

// startReplicas runs n replicas with -storage mysql on db, enqueuing to the
// NanoMDM API at mdmURL with mdmKey, with the README's command line and
// extra flags.
func startReplicas(t *testing.T, db *testkit.DB, mdmURL, mdmKey string, n int, extra ...string) *cluster {
	t.Helper()
	c := &cluster{t: t, db: db, bin: bins["nanocmd"]}
	var targets []*url.URL
	for range n {
		addr := testkit.FreeAddr(t)
		args := append([]string{"-storage", "mysql", "-storage-dsn", db.DSN, "-api", apiKey,
			"-enqueue-url", mdmURL + "/v1/enqueue/", "-push-url", mdmURL + "/v1/push/",
			"-enqueue-api", mdmKey, "-webhook-hmac-key", hmacKey, "-listen", addr}, extra...)
		c.args = append(c.args, args)
		c.addrs = append(c.addrs, addr)
		// all started at once, as replicas of one deployment are: on an
		// empty database they race to create its tables and its keypair
		c.procs = append(c.procs, testkit.StartProc(t, c.bin, nanocmdEnv, args...))
		targets = append(targets, &url.URL{Scheme: "http", Host: addr})
	}
	for i, p := range c.procs {
		testkit.AwaitHTTP(t, p, targets[i].String()+"/version", 60*time.Second)
	}
	c.base = targets[0].String()
	if n > 1 {
		var next atomic.Uint64
		proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(targets[(next.Add(1)-1)%uint64(len(targets))])
		}})
		t.Cleanup(proxy.Close)
		c.base = proxy.URL
	}
	return c
}

// startReplica starts replica i again, or NanoCMD's.
func (c *cluster) startReplica(t *testing.T, i int) {
	t.Helper()
	// killed when the cluster's test ends, not a subtest that restarted it
	c.procs[i] = testkit.StartProc(c.t, c.bin, nanocmdEnv, c.args[i]...)
	testkit.AwaitHTTP(t, c.procs[i], "http://"+c.addrs[i]+"/version", 60*time.Second)
}

// restart stops replica i (SIGTERM, as an operator's restart does) and
// starts it again with the same command line.
func (c *cluster) restart(t *testing.T, i int) {
	t.Helper()
	c.procs[i].Stop()
	c.startReplica(t, i)
}

// logs is what every replica wrote.
func (c *cluster) logs() string {
	var b strings.Builder
	for _, p := range c.procs {
		b.WriteString(p.Logs())
	}
	return b.String()
}

// sender is NanoMDM's webhook sender, pointed at the cluster's URL.
func (c *cluster) sender() *webhook.Webhook {
	return webhook.New(c.base+"/webhook", webhook.WithHMACSecret([]byte(hmacKey)))
}

// call sends an API request with NanoCMD's API key.
func (c *cluster) call(t *testing.T, method, path string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, c.base+path, bytes.NewReader(body))
	req.SetBasicAuth("nanocmd", apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// mustCall is call that fails t on anything but a 2xx.
func (c *cluster) mustCall(t *testing.T, method, path string, body []byte) []byte {
	t.Helper()
	code, b := c.call(t, method, path, body)
	if code/100 != 2 {
		t.Fatalf("%s %s: %d %s", method, path, code, b)
	}
	return b
}

// start starts workflow name for the Macs with context wfCtx.
func (c *cluster) start(t *testing.T, name, wfCtx string, macs ...*mac) {
	t.Helper()
	ids := make([]string, len(macs))
	for i, m := range macs {
		ids[i] = m.id
	}
	c.startFor(t, name, wfCtx, ids...)
}

// startFor starts workflow name for ids with context wfCtx.
func (c *cluster) startFor(t *testing.T, name, wfCtx string, ids ...string) {
	t.Helper()
	q := url.Values{"id": ids}
	if wfCtx != "" {
		q.Set("context", wfCtx)
	}
	c.mustCall(t, "POST", "/v1/workflow/"+name+"/start?"+q.Encode(), nil)
}

// inventory is the inventory route's values for id.
func (c *cluster) inventory(t *testing.T, id string) map[string]any {
	t.Helper()
	var got map[string]map[string]any
	body := c.mustCall(t, "GET", "/v1/inventory?id="+url.QueryEscape(id), nil)
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatalf("inventory of %s: %v: %s", id, err, body)
	}
	return got[id]
}

// waitForCommand waits until a command of requestType is enqueued for m
// that m has not answered, and returns it.
func (c *cluster) waitForCommand(t *testing.T, m *mac, requestType string, within time.Duration) enqueued {
	t.Helper()
	var found enqueued
	testkit.WaitUntil(t, within, m.id+": a "+requestType+" enqueued", func() (bool, any) {
		p := m.pending(c.mdm)
		for _, e := range p {
			if e.RequestType == requestType {
				found = e
				return true, p
			}
		}
		return false, p
	})
	return found
}

// noStepRowsLeft waits until the steps, id_commands and step_commands
// tables are empty.
func (c *cluster) noStepRowsLeft(t *testing.T) {
	t.Helper()
	testkit.WaitUntil(t, 15*time.Second, "no step rows left", func() (bool, any) {
		rows := testkit.CountStepRows(t, c.db.DB)
		return rows == testkit.StepRows{}, rows
	})
}

// passNotUntil moves every NotUntil of the database's steps two minutes
// and a second earlier: the test's clock advance past fvenable's
// two-minute poll interval, a constant of the workflow. Only the database
// is touched; NanoCMD's engine worker then finds the step due as it would
// two minutes later.
func (c *cluster) passNotUntil(t *testing.T) int64 {
	t.Helper()
	res, err := c.db.Exec("UPDATE steps SET not_until = not_until - INTERVAL 121 SECOND WHERE not_until IS NOT NULL")
	if err != nil {
		t.Fatal(err)
	}
	n, _ := res.RowsAffected()
	return n
}
