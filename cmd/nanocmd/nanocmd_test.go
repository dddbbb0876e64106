package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

var bins map[string]string

func TestMain(m *testing.M) {
	testkit.Main(m, "STEPCOLLECT_NANOCMD_BIN_DIR", false, func(b map[string]string) { bins = b }, "cmd/nanocmd", "cmd/worker")
}

const (
	apiKey     = "nanocmd-api-key"
	enqueueKey = "nanomdm-api-key"
	hmacKey    = "webhook-hmac-key"
	inventory  = "io.micromdm.wf.inventory.v1"
)

// nanocmdEnv is every nanocmd's environment in these tests: the services'
// test pool, as the tests share one server's max_connections.
var nanocmdEnv = []string{fmt.Sprintf("NANOCMD_MYSQL_MAX_CONNS=%d", testkit.ServicePoolSize)}

type server struct {
	proc *testkit.Proc
	base string
	mdm  *fakeNanoMDM
}

// startMySQL runs the binary with -storage mysql on db, its commands
// enqueued to a fake NanoMDM.
func startMySQL(t *testing.T, db *testkit.DB, extra ...string) *server {
	t.Helper()
	return start(t, append([]string{"-storage", "mysql", "-storage-dsn", db.DSN}, extra...)...)
}

// start runs the binary with args, its commands enqueued to a fake NanoMDM.
func start(t *testing.T, extra ...string) *server {
	t.Helper()
	mdm := startFakeNanoMDM(t, enqueueKey)
	addr := testkit.FreeAddr(t)
	args := append([]string{"-listen", addr, "-api", apiKey, "-enqueue-url", mdm.URL + "/v1/enqueue/", "-push-url", mdm.URL + "/v1/push/",
		"-enqueue-api", enqueueKey, "-webhook-hmac-key", hmacKey}, extra...)
	p := testkit.StartProc(t, bins["nanocmd"], nanocmdEnv, args...)
	testkit.AwaitHTTP(t, p, "http://"+addr+"/version", 60*time.Second)
	return &server{proc: p, base: "http://" + addr, mdm: mdm}
}

func (s *server) do(t *testing.T, method, path string, auth bool) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, s.base+path, nil)
	if auth {
		req.SetBasicAuth("nanocmd", apiKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// answer sends id's result for c through NanoMDM's own webhook sender,
// signed as NanoMDM signs with -webhook-hmac-key.
func answer(sender *webhook.Webhook, id string, c enqueued) error {
	r := mdm.NewRequestWithContext(context.Background(), nil)
	r.EnrollID = &mdm.EnrollID{ID: id, Type: mdm.Device}
	_, err := sender.CommandAndReportResults(r, &mdm.CommandResults{
		Enrollment: mdm.Enrollment{UDID: id}, CommandUUID: c.UUID, Status: "Acknowledged", Raw: resultPlist(id, c),
	})
	return err
}

// The inventory workflow for 20 enrollments, started through NanoCMD's
// API, every command answered through NanoMDM's webhook sender: each
// enrollment's values are then in the inventory route (both of its paths),
// durable in MySQL, each completion left its receipt, and no step row is
// left.
func TestTheInventoryWorkflowEndToEndOnMySQL(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	ids := runInventory(t, s, 20)
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM subsystem_inventory"); n != len(ids) {
		t.Errorf("%d inventory rows in MySQL, want %d", n, len(ids))
	}
	testkit.WaitUntil(t, 15*time.Second, "no step rows left", func() (bool, any) {
		rows := testkit.CountStepRows(t, db.DB)
		return rows == testkit.StepRows{}, rows
	})
	// each completion's receipt, the evidence a COMMIT whose answer is
	// lost is settled by (a 500 would lose the result)
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM stepcollect_receipts"); n != len(ids) {
		t.Errorf("%d completion receipts, want one for each of the %d enrollments", n, len(ids))
	}
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM stepcollect_state WHERE name = 'schedule_owner_nanocmd'"); n != 1 {
		t.Errorf("the database is not marked as NanoCMD's engine's (%d rows): a cmd/worker on it would claim its steps", n)
	}
}

// -storage inmem and file are NanoCMD's own storages, as in NanoCMD.
func TestTheInventoryWorkflowOnNanoCMDsOwnStorages(t *testing.T) {
	t.Run("inmem", func(t *testing.T) { runInventory(t, start(t, "-storage", "inmem"), 3) })
	t.Run("file", func(t *testing.T) { runInventory(t, start(t, "-storage", "file", "-storage-dsn", t.TempDir()), 3) })
}

// runInventory starts the inventory workflow for n enrollments through
// NanoCMD's API, answers every command through NanoMDM's webhook sender
// and checks each enrollment's values in the inventory route, at both of
// its paths. It returns the enrollments.
func runInventory(t *testing.T, s *server, n int) []string {
	t.Helper()
	ids := make([]string, n)
	q := url.Values{}
	for i := range ids {
		ids[i] = fmt.Sprintf("E2E-%02d", i)
		q.Add("id", ids[i])
	}
	if code, body := s.do(t, "POST", "/v1/workflow/"+inventory+"/start?"+q.Encode(), true); code != http.StatusOK {
		t.Fatalf("workflow start: %d %s", code, body)
	}
	sender := webhook.New(s.base+"/webhook", webhook.WithHMACSecret([]byte(hmacKey)))
	for _, id := range ids {
		cmds := s.mdm.commands(id)
		if len(cmds) != 2 {
			t.Fatalf("%s: %d commands enqueued (%v), want 2; bad requests: %v", id, len(cmds), cmds, s.mdm.bad)
		}
		for _, c := range cmds {
			if err := answer(sender, id, c); err != nil {
				t.Fatalf("%s answering %s: %v", id, c.RequestType, err)
			}
		}
	}

	for _, path := range []string{"/inventory", "/v1/inventory"} {
		code, body := s.do(t, "GET", path+"?"+q.Encode(), true)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		var got map[string]map[string]any
		if err := json.Unmarshal(body, &got); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, body)
		}
		for _, id := range ids {
			if sn := got[id]["serial_number"]; sn != "SN"+id {
				t.Errorf("GET %s: %s's serial_number %v, want SN%s (values %v)", path, id, sn, id, got[id])
			}
		}
	}
	return ids
}

// With -webhook-hmac-key, an unsigned or wrongly signed webhook is refused
// with a 401 before NanoCMD sees it; the API without its key is a 401 too.
func TestAWebhookWithoutTheHMACIsRefused(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	for name, opts := range map[string][]webhook.Option{"unsigned": nil, "wrong key": {webhook.WithHMACSecret([]byte("other"))}} {
		err := answer(webhook.New(s.base+"/webhook", opts...), "DEV-1", enqueued{"U-1", "DeviceInformation"})
		if err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("%s webhook: %v, want a 401", name, err)
		}
	}
	if err := answer(webhook.New(s.base+"/webhook", webhook.WithHMACSecret([]byte(hmacKey))), "DEV-1", enqueued{"U-1", "DeviceInformation"}); err != nil {
		t.Errorf("signed webhook (a command no workflow sent): %v, want 200", err)
	}
	if code, _ := s.do(t, "GET", "/v1/inventory?id=DEV-1", false); code != http.StatusUnauthorized {
		t.Errorf("inventory without the API key: %d, want 401", code)
	}
}

// Without -webhook-hmac-key too, a webhook body over 32 MiB is refused
// with a 413 naming the limit before NanoCMD's handler decodes any of it
// (that handler reads a body of any size), unread when its Content-Length
// says so; the next webhook is answered as before.
func TestAWebhookBodyOverTheLimitIsRefusedWithoutAKey(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db, "-webhook-hmac-key", "")
	// declared, never sent: answered at once
	c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "POST /webhook HTTP/1.1\r\nHost: nanocmd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", 32<<20+1)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a webhook declaring 32 MiB + 1 byte: %v, want a 413", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := "webhook body over 33554432 bytes"; resp.StatusCode != http.StatusRequestEntityTooLarge || strings.TrimSpace(string(b)) != want {
		t.Errorf("a webhook declaring 32 MiB + 1 byte: %d %q, want 413 %q", resp.StatusCode, b, want)
	}
	if err := answer(webhook.New(s.base+"/webhook"), "DEV-1", enqueued{"U-1", "DeviceInformation"}); err != nil {
		t.Errorf("an unsigned webhook without a key (a command no workflow sent): %v, want 200", err)
	}
}

// Every route of NanoCMD v0.7.1 is there, behind the API key, and
// /version without it.
func TestEveryRouteOfNanoCMDIsServed(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	if code, body := s.do(t, "GET", "/version", false); code != http.StatusOK || !strings.Contains(string(body), `"version"`) {
		t.Errorf("/version: %d %s", code, body)
	}
	for _, r := range []struct{ method, path string }{
		{"POST", "/v1/workflow/" + inventory + "/start"}, // 400 without ids
		{"GET", "/v1/event/none"}, {"PUT", "/v1/event/none"},
		{"GET", "/inventory?id=X"}, {"GET", "/v1/inventory?id=X"},
		{"GET", "/v1/profile/none"}, {"PUT", "/v1/profile/none"}, {"DELETE", "/v1/profile/none"}, {"GET", "/v1/profiles"},
		{"GET", "/v1/fvenable/profiletemplate"},
		{"GET", "/v1/cmdplan/none"}, {"PUT", "/v1/cmdplan/none"},
	} {
		if code, _ := s.do(t, r.method, r.path, false); code != http.StatusUnauthorized {
			t.Errorf("%s %s without the key: %d, want 401", r.method, r.path, code)
		}
		// a 404 of a handler is NanoCMD's {"error": …}; the router's is text
		if code, body := s.do(t, r.method, r.path, true); code == http.StatusNotFound && !strings.Contains(string(body), `"error"`) || code == http.StatusMethodNotAllowed || code == http.StatusUnauthorized {
			t.Errorf("%s %s: %d %s: not served", r.method, r.path, code, body)
		}
	}
	// NanoCMD's storages delete a profile that is not there without error
	if code, body := s.do(t, "DELETE", "/v1/profile/none", true); code != http.StatusNoContent {
		t.Errorf("DELETE /v1/profile/none: %d %s, want 204 as NanoCMD v0.7.1 answers", code, body)
	}
}
