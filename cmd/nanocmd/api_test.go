package main_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

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
