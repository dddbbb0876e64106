package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The proxy between NanoMDM and the server counts every post by the
// server's answer, and a device as reached by its command reports alone
// (not its Idle reports).
func TestTheWebhookProxyCountsPostsAnswersAndDevicesReached(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/webhook" {
			t.Errorf("the proxy posted to %s, want /webhook", r.URL.Path)
		}
		if r.URL.Query().Get("fail") != "" {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer backend.Close()
	p, err := startWebhookProxy(backend.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	post := func(query, body string) {
		resp, err := http.Post(p.URL+"/webhook"+query, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	post("", `{"topic":"mdm.Authenticate","checkin_event":{"udid":"D1"}}`)
	p.reset() // enrollment's posts are not the measurement's
	post("", `{"topic":"mdm.Connect","acknowledge_event":{"udid":"D1","status":"Idle"}}`)
	post("", `{"topic":"mdm.Connect","acknowledge_event":{"udid":"D1","status":"Acknowledged","command_uuid":"C1"}}`)
	post("?fail=1", `{"topic":"mdm.Connect","acknowledge_event":{"udid":"D2","status":"Acknowledged","command_uuid":"C1"}}`)

	c := p.counts()
	if c.Posts != 3 || c.Results != 2 || c.ResultsOK != 1 || c.Non2xx != 1 || len(c.reached) != 2 ||
		c.Statuses["200"] != 2 || c.Statuses["500"] != 1 || c.UUIDs != 1 || p.resultsOK() != 1 {
		t.Fatalf("counts %+v, want 3 posts, 2 results of 1 command UUID (1 answered 2xx), 1 non-2xx, 2 devices reached", c)
	}
}
