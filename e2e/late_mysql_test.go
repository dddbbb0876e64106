package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/tcpproxy"
)

// get is a GET's status and body, or -1 and the error when nothing answers.
func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return -1, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// The api and the worker started while MySQL does not answer (a host
// booting them together, a database restarted with the pods) wait for it
// instead of exiting: /healthz answers 200 and /readyz 503 naming MySQL
// meanwhile, and a webhook gets a JSON 503 saying nothing was written.
// Once the server answers they migrate the empty database together, at
// default flags, and do their work. Before, each exited at start ("cannot
// start"), and under `make run` nothing brought them back.
func TestServicesStartedBeforeMySQLWaitForItThenMigrateAndWork(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	rs := testkit.StartRedis(t)
	rcv := testkit.NewReceiver(t, testkit.ReceiverOptions{CompletionsOnly: true})
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	p := tcpproxy.Start(t, cfg.Addr)
	p.Cut()
	cfg.Addr = p.Addr
	dsn := cfg.FormatDSN()

	bins := testkit.Services()
	apiAddr, workerAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	worker := testkit.StartProc(t, bins["worker"], testkit.ServiceEnv(dsn, rs.URL),
		"-metrics-listen", workerAddr, "-callback-url", rcv.URL)
	api := testkit.StartProc(t, bins["api"], append(testkit.ServiceEnv(dsn, rs.URL), "STEPCOLLECT_API_KEY="+apiKey), "-listen", apiAddr)
	procs := map[string]*testkit.Proc{apiAddr: api, workerAddr: worker}
	for addr, proc := range procs {
		testkit.AwaitHTTP(t, proc, "http://"+addr+"/healthz", 15*time.Second)
	}
	time.Sleep(1500 * time.Millisecond) // a few pings' worth: neither gives up
	for addr, proc := range procs {
		code, body := get("http://" + addr + "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "mysql: starting: MySQL does not answer yet") {
			t.Fatalf("%s /readyz while MySQL is down: %d %q, want 503 naming MySQL\n%s", addr, code, body, proc.Logs())
		}
	}
	code, raw, err := testkit.NewClient("http://"+apiAddr, apiKey).Webhook(testkit.Acknowledged("D-1", "U-1"))
	if err != nil || code != http.StatusServiceUnavailable || !strings.Contains(string(raw), "nothing was written") ||
		!strings.HasPrefix(string(raw), "{") {
		t.Errorf("a webhook while the api waits for MySQL: %d %s %v, want a JSON 503 saying nothing was written", code, raw, err)
	}

	p.Restore()
	for addr, proc := range procs {
		testkit.AwaitHTTP(t, proc, "http://"+addr+"/readyz", 30*time.Second)
	}
	client := testkit.NewClient("http://"+apiAddr, apiKey)
	step, ids := testkit.V1FanOut("late-mysql", 40)
	client.MustEnqueue(t, step)
	for _, err := range testkit.SendResults(client.URL+"/webhook", nil, "late-mysql-CMD", ids) {
		t.Error(err)
	}
	testkit.WaitUntil(t, testkit.SettleBound, "every event delivered and the step collected: {distinct events, steps rows}", func() (bool, any) {
		got := [2]int{rcv.Distinct(), testkit.CountStepRows(t, db.DB).Steps}
		return got == [2]int{len(ids), 0}, got
	})
	for addr, proc := range procs {
		if !strings.Contains(proc.Logs(), "waiting for MySQL before starting") || !strings.Contains(proc.Logs(), "MySQL answers: starting") {
			t.Errorf("%s's log does not say it waited for MySQL and then started:\n%s", addr, proc.Logs())
		}
	}
}
