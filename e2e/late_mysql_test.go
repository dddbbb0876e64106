package e2e

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
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
	resp, err := http.Post("http://"+apiAddr+"/webhook", "application/json", bytes.NewReader(testkit.Acknowledged("D-1", "U-1")))
	if err != nil {
		t.Fatal(err)
	}
	var refusal struct {
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
	}
	err = json.NewDecoder(resp.Body).Decode(&refusal)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(refusal.Error, "nothing was written") ||
		refusal.RequestID == "" || resp.Header.Get("X-Request-Id") != refusal.RequestID {
		t.Errorf("a webhook while the api waits for MySQL: %d %+v (X-Request-Id %q) %v, want a JSON 503 saying nothing was written, with its request id",
			resp.StatusCode, refusal, resp.Header.Get("X-Request-Id"), err)
	}
	if !strings.Contains(api.Logs(), `"status":503`) {
		t.Errorf("the refused webhook has no access log line:\n%s", api.Logs())
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

// A server that takes the connection and says nothing (a host half up, a
// balancer with no backend) holds the first ping for its 5 s: /healthz and
// /version answer at once all the same (a liveness probe must not wait on
// the database), and /readyz names the silence once the ping gives up.
// Before, /healthz waited out the ping (4.5 s measured from outside).
func TestHealthzAnswersAtOnceWhileTheFirstPingHangs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	rs := testkit.StartRedis(t)
	bins := testkit.Services()
	for name, flag := range map[string]string{"api": "-listen", "worker": "-metrics-listen"} {
		addr := testkit.FreeAddr(t)
		p := testkit.StartProc(t, bins[name], testkit.ServiceEnv("root@tcp("+ln.Addr().String()+")/silent?parseTime=true", rs.URL), flag, addr)
		testkit.WaitUntil(t, 15*time.Second, name+" accepting connections", func() (bool, any) {
			err := testkit.Dial(addr)
			return err == nil, err
		})
		for _, path := range []string{"/healthz", "/version"} {
			began := time.Now()
			code, body := get("http://" + addr + path)
			if d := time.Since(began); code != http.StatusOK || d > 2*time.Second {
				t.Errorf("%s %s while the first ping hangs: %d %q after %v, want 200 at once", name, path, code, body, d)
			}
		}
		code, body := get("http://" + addr + "/readyz")
		if code != http.StatusServiceUnavailable || !strings.Contains(body, "mysql: starting: MySQL does not answer yet (no answer within 5s)") {
			t.Errorf("%s /readyz once the first ping gave up: %d %q, want 503 naming the silence\n%s", name, code, body, p.Logs())
		}
	}
}
