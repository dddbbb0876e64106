package main_test

import (
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// Ten connections that each sent headers claiming a 32 MiB webhook and no
// byte of it do not delay a signed result: the real api at default flags
// with a webhook HMAC key answers it 200, committed, within a second. The
// api that reserved the body budget from Content-Length before any byte
// arrived held it for every one of them until its 2-minute read timeout.
func TestSilentConnectionsDoNotDelayASignedResult(t *testing.T) {
	const key = "slow-client-key"
	hmacKey := []byte("slow-client-hmac")
	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	_, url := testkit.StartService(t, apiBin, testkit.ServiceEnv(db.DSN, rs.URL,
		"STEPCOLLECT_API_KEY="+key, "STEPCOLLECT_WEBHOOK_HMAC_KEY="+string(hmacKey)), "listen")
	c := testkit.NewClient(url, key)
	step, ids := testkit.V1FanOut("SLOW", 1)
	stepID := c.MustEnqueue(t, step)

	addr := url[len("http://"):]
	for i := range 10 {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if _, err := fmt.Fprintf(conn, "POST /webhook HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", addr, 32<<20); err != nil {
			t.Fatalf("silent connection %d: %v", i, err)
		}
	}
	start := time.Now()
	sent := make(chan []error, 1)
	go func() { sent <- testkit.SendResults(url+"/webhook", hmacKey, "SLOW-CMD", ids) }()
	select {
	case errs := <-sent:
		if took := time.Since(start); len(errs) > 0 || took > time.Second {
			t.Fatalf("a signed result beside 10 silent 32 MiB claims: %v after %v, want 200 within 1 s", errs, took)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("a signed result beside 10 silent 32 MiB claims: no answer within 15 s, want 200 within 1 s")
	}
	took := time.Since(start)
	// Committed: nothing is outstanding (no worker runs to collect it).
	if status, got := c.V1(t, http.MethodGet, fmt.Sprintf("/v1/steps/%d", stepID), nil); status != http.StatusOK || got["outstanding_ids"] != 0.0 {
		t.Errorf("GET /v1/steps/%d after the 200: %d %v, want 200 with 0 outstanding", stepID, status, got)
	}
	t.Logf("answered 200 in %v", took)
}
