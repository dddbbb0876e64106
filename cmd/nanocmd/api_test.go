package main_test

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// request sends an API request with NanoCMD's API key and the headers h,
// and returns the status and the body's "error".
func (s *server) request(t *testing.T, method, path string, body io.Reader, h map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, s.base+path, body)
	req.SetBasicAuth("nanocmd", apiKey)
	for k, v := range h {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Error string }
	if json.Unmarshal(b, &e) != nil || e.Error == "" {
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	return resp.StatusCode, e.Error
}

// A browser's form POST from another site, which carries the Basic
// credentials the browser cached, is refused with a 403 naming why on
// every keyed route, and the lock it asks for is not enqueued; the same
// request from the server's own origin, or from a client that is not a
// browser, goes through.
func TestACrossSiteRequestToTheAPIIsRefused(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	crossSite := map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example", "Content-Type": "application/x-www-form-urlencoded"}
	for _, r := range []struct{ method, path string }{
		{"POST", "/v1/workflow/" + wfLock + "/start?id=CSRF-1"},
		{"PUT", "/v1/profile/csrf"}, {"DELETE", "/v1/profile/csrf"},
		{"PUT", "/v1/cmdplan/csrf"}, {"PUT", "/v1/event/csrf"},
	} {
		code, msg := s.request(t, r.method, r.path, strings.NewReader("x=1"), crossSite)
		if code != http.StatusForbidden || !strings.Contains(msg, "cross-origin") {
			t.Errorf("%s %s from another site: %d %q, want 403 naming the cross-origin request", r.method, r.path, code, msg)
		}
	}
	if cmds := s.mdm.commands("CSRF-1"); len(cmds) != 0 {
		t.Errorf("a cross-site start enqueued %v", cmds)
	}
	sameOrigin := map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": s.base}
	for i, h := range []map[string]string{sameOrigin, nil} {
		if code, msg := s.request(t, "POST", fmt.Sprintf("/v1/workflow/%s/start?id=CSRF-OK-%d", wfLock, i), nil, h); code != http.StatusOK {
			t.Errorf("a start with headers %v: %d %q, want 200", h, code, msg)
		}
	}
}

// A client's mistake is answered 400, 404 or 409 naming the field or the
// thing, never a 500, and nothing of the schema is in the answer (NanoCMD
// v0.7.1 answers each of these 500, some naming a table and column); the
// MDM server's refusal to enqueue is a 502 with its words.
func TestClientMistakesAreAnsweredWithTheirStatus(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db, "-webhook-hmac-key", "")
	s.mdm.mu.Lock()
	s.mdm.refuse["REFUSED-1"] = true
	s.mdm.mu.Unlock()
	start := func(wf, query string) string { return "/v1/workflow/" + wf + "/start?" + query }
	if code, msg := s.request(t, "POST", start(wfLock, "id=LOCKED-1"), nil, nil); code != http.StatusOK {
		t.Fatalf("starting the lock: %d %q", code, msg)
	}
	for _, c := range []struct {
		name, method, path, body string
		want                     int
		says                     string
	}{
		{"unknown workflow", "POST", start("io.example.nope", "id=A"), "", 404, `workflow: no such workflow "io.example.nope"`},
		{"a 256-byte id", "POST", start(wfInventory, "id="+strings.Repeat("A", 256)), "", 400, "id: "},
		{"an empty id", "POST", start(wfInventory, "id="), "", 400, "id: "},
		{"a NUL in an id", "POST", start(wfInventory, "id=A%00B"), "", 400, "id: "},
		{"an id not UTF-8", "POST", start(wfInventory, "id=A%FFB"), "", 400, "id: "},
		{"a repeated id", "POST", start(wfInventory, "id=R&id=R"), "", 400, "id: "},
		{"ids equal but for case", "POST", start(wfInventory, "id=Cc&id=cC"), "", 400, "id: "},
		{"already started", "POST", start(wfLock, "id=LOCKED-1"), "", 409, "already started"},
		{"a missing profile", "POST", start(wfProfile, "id=A&context=nope"), "", 404, `profile: no profile named "nope"`},
		{"no profile named", "POST", start(wfProfile, "id=A"), "", 400, "context: "},
		{"a missing cmdplan", "POST", start(wfCMDPlan, "id=A&context=nope"), "", 404, `cmdplan: no cmdplan named "nope"`},
		{"GET a missing profile", "GET", "/v1/profile/nope", "", 404, `profile: no profile named "nope"`},
		{"GET a missing cmdplan", "GET", "/v1/cmdplan/nope", "", 404, `cmdplan: no cmdplan named "nope"`},
		{"a cmdplan not JSON", "PUT", "/v1/cmdplan/x", "{bad", 400, "body: "},
		{"a cmdplan name not UTF-8", "PUT", "/v1/cmdplan/A%FFB", "{}", 400, "name: "},
		{"an event name of 300 bytes", "PUT", "/v1/event/" + strings.Repeat("A", 300), `{"event":"Enrollment","workflow":"` + wfInventory + `"}`, 400, "name: "},
		{"refused by the MDM server", "POST", start(wfInventory, "id=REFUSED-1"), "", 502, "MDM server did not enqueue"},
		{"webhook {}", "POST", "/webhook", "{}", 400, "topic: missing"},
		{"webhook null", "POST", "/webhook", "null", 400, "topic: missing"},
		{"a result without its event", "POST", "/webhook", `{"topic":"mdm.Connect"}`, 400, "acknowledge_event: missing"},
		{"a check-in without its event", "POST", "/webhook", `{"topic":"mdm.Authenticate"}`, 400, "checkin_event: missing"},
		{"a topic NanoCMD does not use", "POST", "/webhook", `{"topic":"mdm.DeclarativeManagement","checkin_event":{"udid":"A"}}`, 200, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			var body io.Reader
			if c.body != "" {
				body = strings.NewReader(c.body)
			}
			code, msg := s.request(t, c.method, c.path, body, nil)
			if code != c.want || !strings.Contains(msg, c.says) {
				t.Errorf("%s %.60s: %d %q, want %d saying %q", c.method, c.path, code, msg, c.want, c.says)
			}
			for _, schema := range []string{"`", "Error 1", "id_commands", "subsystem_", "wf_"} {
				// a 502 quotes the MDM server, whose words they are
				if strings.Contains(msg, schema) && code != http.StatusBadGateway {
					t.Errorf("%s %.60s: %q names the schema (%s)", c.method, c.path, msg, schema)
				}
			}
		})
	}
}

// A keyed route's body over 32 MiB is refused with a 413 naming the limit
// before NanoCMD's handler reads it (its profile handler reads a body of
// any size into memory), unread when its Content-Length says so.
func TestAnAPIBodyOverTheLimitIsRefused(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	c, err := net.Dial("tcp", strings.TrimPrefix(s.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	auth := base64.StdEncoding.EncodeToString([]byte("nanocmd:" + apiKey))
	fmt.Fprintf(c, "PUT /v1/profile/big HTTP/1.1\r\nHost: nanocmd\r\nAuthorization: Basic %s\r\nContent-Length: %d\r\n\r\n", auth, 32<<20+1)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("a profile declaring 32 MiB + 1 byte: %v, want a 413", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if want := `{"error":"body over 33554432 bytes"}`; resp.StatusCode != http.StatusRequestEntityTooLarge || strings.TrimSpace(string(b)) != want {
		t.Errorf("a profile declaring 32 MiB + 1 byte: %d %s, want 413 %s", resp.StatusCode, b, want)
	}
}
