package httpapi_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/micromdm/nanomdm/mdm"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/tcpproxy"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"

	"github.com/hibiken/asynq"
)

func TestNanoMDMResultsCompleteAStepAndWriteOneEventEach(t *testing.T) {
	b := setup(t, &setupOpts{hmacKey: hmacKey})
	ids := []string{"DEV-A", "DEV-B", "DEV-C"}
	stepID := b.enqueue(t, "io.example.inventory", ids, "CU-1", "CU-2")
	w := b.sender(hmacKey)

	for _, id := range ids {
		// NotNow first: recorded, not completing
		if err := sendResult(w, id, "CU-1", "NotNow"); err != nil {
			t.Fatalf("%s NotNow: %v", id, err)
		}
		if err := sendResult(w, id, "CU-1", "Acknowledged"); err != nil {
			t.Fatal(err)
		}
		// Idle carries no command: ignored
		if _, err := w.CommandAndReportResults(mdmRequest(id), &mdm.CommandResults{
			Enrollment: mdm.Enrollment{UDID: id}, Status: "Idle", Raw: testkit.ResultPlist(id, "", "Idle")}); err != nil {
			t.Fatal(err)
		}
		// a command no workflow sent: ignored
		if err := sendResult(w, id, "NOT-OURS", "Acknowledged"); err != nil {
			t.Fatal(err)
		}
		status := "Acknowledged"
		if id == "DEV-C" {
			status = "Error" // an error completes the command too
		}
		if err := sendResult(w, id, "CU-2", status); err != nil {
			t.Fatal(err)
		}
	}

	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps WHERE id = ?`, stepID); n != 0 {
		t.Errorf("step %d not collected", stepID)
	}
	rows, err := b.db.Query(`SELECT enrollment_id, payload FROM stepcollect_outbox WHERE event_type = 'step.completed' ORDER BY enrollment_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id string
		var payload []byte
		if err := rows.Scan(&id, &payload); err != nil {
			t.Fatal(err)
		}
		var ev events.Event
		if err := json.Unmarshal(payload, &ev); err != nil {
			t.Fatal(err)
		}
		got = append(got, id)
		if ev.Step.StepID != stepID || ev.Step.WorkflowName != "io.example.inventory" || string(ev.Step.Context) != "ctx" || len(ev.Step.Commands) != 2 {
			t.Errorf("%s: event %+v", id, ev)
		}
		for _, c := range ev.Step.Commands {
			if !strings.Contains(string(c.Result), "<string>"+c.CommandUUID+"</string>") || !strings.Contains(string(c.Result), id+"'s Mac") {
				t.Errorf("%s: command %s carries another result: %s", id, c.CommandUUID, c.Result)
			}
		}
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Errorf("events for %v, want one each for %v", got, ids)
	}
	for outcome, want := range map[string]float64{"not_now": 3, "stored": 3, "completed_step": 3, "ignored": 6, "rejected": 0, "error": 0} {
		if got := testutil.ToFloat64(b.m.API.Results.WithLabelValues(outcome)); got != want {
			t.Errorf("results_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

func TestCheckOutAndAuthenticateCancelTheEnrollmentsSteps(t *testing.T) {
	b := setup(t, nil)
	b.enqueue(t, "wf.one", []string{"DEV-1", "DEV-2"}, "U-1")
	b.enqueue(t, "wf.two", []string{"DEV-1", "DEV-2"}, "U-2")
	w := b.sender(nil)
	if err := w.CheckOut(mdmRequest("DEV-1"), &mdm.CheckOut{Enrollment: mdm.Enrollment{UDID: "DEV-1"}, Raw: checkinPlist("DEV-1", "CheckOut")}); err != nil {
		t.Fatal(err)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE enrollment_id = 'DEV-1'`); n != 0 {
		t.Errorf("CheckOut left %d rows of DEV-1", n)
	}
	if err := w.Authenticate(mdmRequest("DEV-2"), &mdm.Authenticate{Enrollment: mdm.Enrollment{UDID: "DEV-2"}, Raw: checkinPlist("DEV-2", "Authenticate")}); err != nil {
		t.Fatal(err)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands`); n != 0 {
		t.Errorf("Authenticate left %d rows", n)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps`); n != 0 {
		t.Errorf("%d cancelled steps not collected", n)
	}
}

// Every bad input docs/reference.md ("POST /webhook") lists: its status, a one-line reason naming
// the field, and the database exactly as it was.
func TestBadWebhookInputsAreRejectedAndWriteNothing(t *testing.T) {
	b := setup(t, &setupOpts{maxBody: 64 << 10})
	b.enqueue(t, "wf", []string{"DEV-1"}, "U-1")
	before := snapshot(t, b.db.DB)
	good := base64.StdEncoding.EncodeToString(testkit.ResultPlist("DEV-1", "U-1", "Acknowledged"))
	noStatus := base64.StdEncoding.EncodeToString([]byte(`<plist version="1.0"><dict><key>CommandUUID</key><string>U-1</string></dict></plist>`))
	ack := func(fields string) string {
		return `{"topic":"mdm.Connect","created_at":"2026-11-29T00:00:00Z","acknowledge_event":{` + fields + `}}`
	}
	for _, tc := range []struct {
		name, body string
		status     int
		want       string
	}{
		{"not json", `{"topic":`, 400, "body: not JSON"},
		{"not an object", `[1,2]`, 400, "body: want a JSON object"},
		{"topic not a string", `{"topic":7}`, 400, "topic: want string"},
		{"no topic", `{"acknowledge_event":{}}`, 400, "topic: missing"},
		{"connect without event", `{"topic":"mdm.Connect"}`, 400, "acknowledge_event: missing for topic mdm.Connect"},
		{"raw_payload not base64", ack(`"udid":"DEV-1","command_uuid":"U-1","raw_payload":"%%%"`), 400, "acknowledge_event.raw_payload: not standard base64"},
		{"raw_payload missing", ack(`"udid":"DEV-1","command_uuid":"U-1"`), 400, "acknowledge_event.raw_payload: missing"},
		{"raw_payload not a plist", ack(`"udid":"DEV-1","command_uuid":"U-1","raw_payload":"` + base64.StdEncoding.EncodeToString([]byte("hello there")) + `"`), 400, "acknowledge_event.raw_payload: not a plist"},
		{"plist without status", ack(`"udid":"DEV-1","command_uuid":"U-1","raw_payload":"` + noStatus + `"`), 400, "the result plist has no Status"},
		{"no enrollment id", ack(`"command_uuid":"U-1","raw_payload":"` + good + `"`), 400, "acknowledge_event: no udid or enrollment_id"},
		{"checkout without enrollment", `{"topic":"mdm.CheckOut","checkin_event":{"raw_payload":"` + base64.StdEncoding.EncodeToString(checkinPlist("", "CheckOut")) + `"}}`, 400, "checkin_event: no udid or enrollment_id"},
		{"too large", ack(`"udid":"DEV-1","raw_payload":"` + strings.Repeat("A", 70<<10) + `"`), 413, "body: larger than the 65536-byte limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(b.srv.URL+"/webhook", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var eb struct {
				Error     string `json:"error"`
				RequestID string `json:"request_id"`
			}
			json.Unmarshal(raw, &eb)
			if resp.StatusCode != tc.status || !strings.Contains(eb.Error, tc.want) || strings.Contains(eb.Error, "\n") || eb.RequestID == "" {
				t.Errorf("%d %q, want %d with one line containing %q", resp.StatusCode, raw, tc.status, tc.want)
			}
		})
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Errorf("bad inputs changed the database:\n before %s\n after  %s", before, after)
	}
	if got := testutil.ToFloat64(b.m.API.Results.WithLabelValues("rejected")); got != 12 {
		t.Errorf("rejected %v, want 12", got)
	}
}

func TestWebhookWithoutTheRightHMACIsRejected(t *testing.T) {
	b := setup(t, &setupOpts{hmacKey: hmacKey})
	b.enqueue(t, "wf", []string{"DEV-1"}, "U-1")
	before := snapshot(t, b.db.DB)
	for name, w := range map[string]interface {
		CommandAndReportResults(*mdm.Request, *mdm.CommandResults) (*mdm.Command, error)
	}{"unsigned": b.sender(nil), "wrong key": b.sender([]byte("not the key"))} {
		_, err := w.CommandAndReportResults(mdmRequest("DEV-1"), &mdm.CommandResults{
			Enrollment: mdm.Enrollment{UDID: "DEV-1"}, CommandUUID: "U-1", Status: "Acknowledged", Raw: testkit.ResultPlist("DEV-1", "U-1", "Acknowledged")})
		if err == nil || !strings.Contains(err.Error(), "401") {
			t.Errorf("%s: %v, want 401", name, err)
		}
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Error("a rejected webhook changed the database")
	}
	if err := sendResult(b.sender(hmacKey), "DEV-1", "U-1", "Acknowledged"); err != nil {
		t.Errorf("signed: %v", err)
	}
}

// Redis down is never a reason for a non-200: the result is committed, its
// event is in the outbox, and the step waits for the sweeper.
func TestWebhookAnswers200AndCommitsWithRedisDown(t *testing.T) {
	rs := testkit.StartRedis(t)
	opt, _ := asynq.ParseRedisURI(rs.URL)
	var failed int
	enq := tasks.NewEnqueuer(opt, tasks.OnEnqueueFailure(func(string) { failed++ }))
	defer enq.Close()
	b := setup(t, &setupOpts{sink: enq})
	stepID := b.enqueue(t, "wf", []string{"DEV-1", "DEV-2"}, "U-1")
	rs.Kill()
	w := b.sender(nil)
	for _, id := range []string{"DEV-1", "DEV-2"} {
		if err := sendResult(w, id, "U-1", "Acknowledged"); err != nil {
			t.Fatalf("%s with Redis down: %v", id, err)
		}
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands`); n != 0 {
		t.Errorf("%d results not committed", n)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox`); n != 2 {
		t.Errorf("%d events, want 2", n)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps WHERE id = ?`, stepID); n != 1 {
		t.Errorf("the step should wait for the sweeper, found %d", n)
	}
	if failed == 0 {
		t.Error("the failed hand-off was not counted")
	}
}

// MySQL unreachable: 503, nothing half-written; once it is back the same
// result commits once.
func TestWebhookAnswers503WhenMySQLIsUnreachableAndNothingIsHalfWritten(t *testing.T) {
	db := testkit.NewDB(t, nil)
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := tcpproxy.Start(t, cfg.Addr) // whichever server the tests use
	cfg.Net, cfg.Addr = "tcp", proxy.Addr
	pdb, err := stepmysql.OpenDB(cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer pdb.Close()
	b := setup(t, &setupOpts{db: db, storeDB: pdb})
	b.enqueue(t, "wf", []string{"DEV-1", "DEV-2"}, "U-1")
	before := snapshot(t, b.db.DB)

	proxy.Cut()
	resp, err := http.Post(b.srv.URL+"/webhook", "application/json", bytes.NewReader(testkit.Acknowledged("DEV-1", "U-1")))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(raw), "nothing was written") {
		t.Fatalf("with MySQL unreachable: %d %s", resp.StatusCode, raw)
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Error("a 503 changed the database")
	}

	proxy.Restore()
	testkit.WaitUntil(t, 10*time.Second, "the result answered 200 once MySQL came back (its status)", func() (bool, any) {
		status, _, err := b.client.Webhook(testkit.Acknowledged("DEV-1", "U-1"))
		if err != nil {
			t.Fatal(err)
		}
		return status == http.StatusOK, status
	})
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE enrollment_id = 'DEV-1'`); n != 1 {
		t.Errorf("%d events for DEV-1, want 1", n)
	}
	if got := testutil.ToFloat64(b.m.API.Results.WithLabelValues("error")); got < 1 {
		t.Errorf("the 503 was not counted")
	}
}

// -dump-webhook: every webhook body, as received, one per line, refused
// ones too (that is when an operator needs to see them).
func TestDumpWebhookWritesEveryBodyOnALine(t *testing.T) {
	var out syncBuffer
	b := newBudgetServer(t, httpapi.Config{DumpWebhook: &out, WebhookHMACKey: hmacKey})
	signed, unsigned := ignoredWebhook(10), ignoredWebhook(20)
	if status, _ := b.post(signed, hmacKey); status != 200 {
		t.Fatalf("signed: %d", status)
	}
	if status, _ := b.post(unsigned, nil); status != 401 {
		t.Fatalf("unsigned: %d", status)
	}
	if got, want := out.String(), signed+"\n"+unsigned+"\n"; got != want {
		t.Errorf("dumped %q, want %q", got, want)
	}
}

// A result for a command no step holds is answered 200, counted, and
// logged at WARN with the enrollment and the command.
func TestUnknownCommandResultIsCountedAndWarned(t *testing.T) {
	b := setup(t, nil)
	var logs syncBuffer
	c := serve(t, b, func(cfg *httpapi.Config) { cfg.Logger = zerolog.New(&logs).Level(zerolog.WarnLevel) })
	status, _, err := c.Webhook(testkit.Acknowledged("E-LOST", "U-LOST"))
	if err != nil || status != http.StatusOK {
		t.Fatalf("webhook: %d %v, want 200", status, err)
	}
	if got := testutil.ToFloat64(b.m.API.UnknownCommandResults); got != 1 {
		t.Errorf("stepcollect_unknown_command_results_total = %v, want 1", got)
	}
	line := logs.String()
	if !strings.Contains(line, `"level":"warn"`) || !strings.Contains(line, "E-LOST") || !strings.Contains(line, "U-LOST") {
		t.Errorf("log %q, want a warn line naming E-LOST and U-LOST", line)
	}
}

// A webhook called with another method is told which one it takes, in the
// JSON every other refusal has.
func TestWebhookRefusesOtherMethodsNamingPOST(t *testing.T) {
	b := setup(t, nil)
	req, _ := http.NewRequest("GET", b.srv.URL+"/webhook", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct{ Error string }
	json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "POST" || body.Error != "method GET: the webhook takes POST" {
		t.Errorf("GET /webhook: %d, Allow %q, %+v", resp.StatusCode, resp.Header.Get("Allow"), body)
	}
}

// A /v1 path that exists, asked with a method it does not take, is a 405
// naming the methods it takes (the catch-all /v1/ route matches every
// method, so the mux alone answered 404, as for a path that does not
// exist); a path that does not exist stays a 404.
func TestV1OtherMethodsAre405NamingTheOnesTaken(t *testing.T) {
	b := setup(t, nil)
	for _, c := range []struct {
		method, path string
		status       int
		allow, msg   string
	}{
		{"PUT", "/v1/steps/1", 405, "GET, DELETE", "method PUT: /v1/steps/1 takes GET or DELETE"},
		{"PATCH", "/v1/steps", 405, "GET, POST, DELETE", "method PATCH: /v1/steps takes GET or POST or DELETE"},
		{"GET", "/v1/events/e-1/deliver", 405, "POST", "method GET: /v1/events/e-1/deliver takes POST"},
		{"PUT", "/v1/nothing", 404, "", "no such endpoint: PUT /v1/nothing"},
	} {
		req, _ := http.NewRequest(c.method, b.srv.URL+c.path, nil)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.status || resp.Header.Get("Allow") != c.allow || body.Error != c.msg {
			t.Errorf("%s %s: %d, Allow %q, %q; want %d, %q, %q", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), body.Error, c.status, c.allow, c.msg)
		}
	}
}

// A path the api does not serve is a JSON 404 naming it, as every other
// refusal (net/http's own is plain text).
func TestAnUnknownPathIsAJSON404(t *testing.T) {
	b := setup(t, nil)
	for _, path := range []string{"/", "/nothing", "/webhookx"} {
		resp, err := http.Get(b.srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		err = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != 404 || err != nil || body.Error != "no such endpoint: GET "+path || resp.Header.Get("Content-Type") != "application/json" {
			t.Errorf("GET %s: %d %q (%v, %s), want a JSON 404 naming it", path, resp.StatusCode, body.Error, err, resp.Header.Get("Content-Type"))
		}
	}
}

// A /v1 path with an empty, "." or ".." segment is refused naming it, not
// redirected to its cleaned form: that is another endpoint (an enrollment
// id ".." written unescaped made DELETE /v1/enrollments/../steps a DELETE
// /v1/steps), and the redirect came before the key was checked.
func TestAnUncleanV1PathIsRefusedNotRedirected(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "wf", []string{"D1"}, "CLEAN-1")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, c := range []struct {
		method, path string
		key          bool
		status       int
	}{
		{"DELETE", "/v1/enrollments/../steps?workflow_name=wf", true, 400},
		{"DELETE", "/v1/enrollments/./steps", true, 400},
		{"DELETE", "/v1/enrollments//steps", true, 400},
		{"GET", "/v1//steps/1", true, 400},
		{"GET", "/v1/steps/1/..", true, 400},
		{"DELETE", "/v1/enrollments/../steps", false, 401},
	} {
		req, _ := http.NewRequest(c.method, b.srv.URL+c.path, nil)
		if c.key {
			req.Header.Set("Authorization", "Bearer "+apiKey)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct{ Error string }
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		escaped, _, _ := strings.Cut(c.path, "?")
		want := `path "` + escaped + `" has an empty, "." or ".." segment`
		if resp.StatusCode != c.status || resp.Header.Get("Location") != "" || (c.status == 400 && !strings.HasPrefix(body.Error, want)) {
			t.Errorf("%s %s: %d, Location %q, %q; want %d naming the path", c.method, c.path, resp.StatusCode, resp.Header.Get("Location"), body.Error, c.status)
		}
	}
	// nothing was cancelled by any of them
	if status, st := b.client.V1(t, "GET", "/v1/steps/"+itoa(id), nil); status != 200 || st["outstanding_ids"].(float64) != 1 {
		t.Errorf("the step after the refusals: %d %v", status, st)
	}
}

// A browser's POST to the webhook (a cross-site form sends text/plain with
// no preflight) is a 403 naming why, and commits nothing, signed or not:
// NanoMDM sends neither Origin nor Sec-Fetch-Site. NanoMDM's own POST
// still completes the step.
func TestWebhookRefusesABrowsersPOST(t *testing.T) {
	b := setup(t, nil)
	b.enqueue(t, "wf", []string{"DEV-1"}, "U-1")
	before := snapshot(t, b.db.DB)
	body := testkit.WebhookBody("DEV-1", "U-1", testkit.ResultPlist("DEV-1", "U-1", "Acknowledged"))
	for _, tc := range []struct {
		name    string
		headers map[string]string
		msg     string
	}{
		{"a cross-site form", map[string]string{"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"}, "Sec-Fetch-Site"},
		{"a same-site fetch", map[string]string{"Origin": "https://sub.example", "Sec-Fetch-Site": "same-site"}, "same-site"},
		{"an Origin alone", map[string]string{"Origin": "null"}, "Origin"},
		{"a same-origin POST", map[string]string{"Origin": "http://127.0.0.1", "Sec-Fetch-Site": "same-origin"}, "Origin"},
	} {
		req, err := http.NewRequest("POST", b.srv.URL+"/webhook", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "text/plain")
		for k, v := range tc.headers {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(raw), tc.msg) || !strings.Contains(string(raw), "browser") {
			t.Errorf("%s: %d %s, want 403 naming %s and the browser", tc.name, resp.StatusCode, raw, tc.msg)
		}
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Error("a browser's webhook POST changed the database")
	}
	if err := sendResult(b.sender(nil), "DEV-1", "U-1", "Acknowledged"); err != nil {
		t.Errorf("NanoMDM's POST: %v", err)
	}
}
