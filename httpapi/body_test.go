package httpapi_test

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
)

// budgetServer is the handler alone (no storage: the bodies here are
// webhooks it ignores, or steps a stub takes) behind an httptest server.
type budgetServer struct {
	srv *httptest.Server
	m   *metrics.Set
}

func newBudgetServer(t *testing.T, cfg httpapi.Config) *budgetServer {
	t.Helper()
	m := metrics.New(nil, nil)
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	cfg.Metrics, cfg.Gatherer = m.API, m.Registry
	srv := httptest.NewServer(httpapi.New(cfg))
	t.Cleanup(srv.Close)
	return &budgetServer{srv: srv, m: m}
}

func (b *budgetServer) inflight() float64 { return testutil.ToFloat64(b.m.API.InflightBodyBytes) }

func (b *budgetServer) awaitInflight(t *testing.T, want float64) {
	t.Helper()
	testkit.WaitUntil(t, 10*time.Second, fmt.Sprintf("%v in-flight body bytes", want), func() (bool, any) {
		got := b.inflight()
		return got == want, got
	})
}

// open sends a POST's headers announcing length bytes and the first sent
// of them, and leaves the connection open.
func (b *budgetServer) open(t *testing.T, path string, length int, sent string) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", b.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, length, sent); err != nil {
		t.Fatal(err)
	}
	return conn
}

// post sends body to /webhook, signed with key when key is set, and returns
// the status (-1: no answer within 10 s) and how long the answer took.
func (b *budgetServer) post(body string, key []byte) (int, time.Duration) {
	req, _ := http.NewRequest("POST", b.srv.URL+"/webhook", strings.NewReader(body))
	if key != nil {
		mac := hmac.New(sha256.New, key)
		mac.Write([]byte(body))
		req.Header.Set("X-Hmac-Signature", base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	}
	start := time.Now()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return -1, time.Since(start)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// ignoredWebhook is a webhook the API answers 200 without the storage.
func ignoredWebhook(pad int) string {
	return `{"topic":"mdm.TokenUpdate","pad":"` + strings.Repeat("x", pad) + `"}`
}

// Connections that sent headers claiming the largest body and then nothing
// hold none of the budget: a signed small webhook is answered at once. On
// the budget that reserved Content-Length x 5 before reading, three of them
// held the budget for the server's read timeout.
func TestHeadersWithoutABodyHoldNoBudget(t *testing.T) {
	b := newBudgetServer(t, httpapi.Config{WebhookHMACKey: hmacKey}) // default limits
	for range 10 {
		b.open(t, "/webhook", httpapi.DefaultMaxBody, "")
	}
	half := ignoredWebhook(2000)
	partial := b.open(t, "/webhook", len(half), half[:1000])

	status, took := b.post(ignoredWebhook(300), hmacKey)
	if status != 200 || took > time.Second {
		t.Errorf("signed small webhook beside 10 silent 32 MiB claims: %d after %v, want 200 within 1 s", status, took)
	}
	if got := b.inflight(); got != 0 {
		t.Errorf("%v body bytes held by bodies that have not arrived, want 0", got)
	}

	// The half-sent one sends the rest and is answered as any other.
	if _, err := io.WriteString(partial, half[1000:]); err != nil {
		t.Fatal(err)
	}
	partial.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(partial), nil)
	if err != nil {
		t.Fatalf("the half-sent webhook, completed, was not answered: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 { // unsigned
		t.Errorf("the half-sent webhook, completed: %d, want 401 (it is not signed)", resp.StatusCode)
	}
	b.awaitInflight(t, 0)
}

// A large body holds its size while it arrives, never more, and only while
// it keeps arriving: one that stops is cut off with a 408 naming the rate,
// and gives its share back. A small body is not held up by it meanwhile.
func TestABodyThatStopsArrivingIsCutOffAndGivesItsShareBack(t *testing.T) {
	const size = 200 << 10
	b := newBudgetServer(t, httpapi.Config{MaxBody: 1 << 20, MaxInflightBodyBytes: 1 << 20,
		BodyGrace: 300 * time.Millisecond, MinBodyRate: 1 << 20})
	body := ignoredWebhook(size - len(ignoredWebhook(0)))
	conn := b.open(t, "/webhook", len(body), body[:100<<10])
	b.awaitInflight(t, size) // its arrival share: its size, not 5x

	if status, took := b.post(ignoredWebhook(300), nil); status != 200 || took > time.Second {
		t.Errorf("small webhook beside a large one arriving: %d after %v, want 200 at once", status, took)
	}

	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the body that stopped: %v", err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(raw), "arrived too slowly") {
		t.Errorf("a body that stopped arriving: %d %s, want 408 naming the rate", resp.StatusCode, raw)
	}
	b.awaitInflight(t, 0)

	// Without a Content-Length, a large body is read whole all the same.
	req, _ := http.NewRequest("POST", b.srv.URL+"/webhook", io.MultiReader(strings.NewReader(body)))
	req.ContentLength = -1
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("chunked %d-byte webhook: %d, want 200", len(body), resp.StatusCode)
	}
	b.awaitInflight(t, 0)
}

// A body that announced far more than it sent, then stopped, is cut off by
// what it sent: grace plus its bytes at the rate. The deadline counted the
// bytes still to come, so the rest of a 32 MiB body had 128 s more, and
// four such clients held the budget from every large result that long.
func TestABodyThatStopsIsCutOffByWhatItSentNotWhatItAnnounced(t *testing.T) {
	const announced, sent, rate = 1 << 20, 100 << 10, 64 << 10
	b := newBudgetServer(t, httpapi.Config{MaxBody: announced, MaxInflightBodyBytes: announced,
		BodyGrace: 300 * time.Millisecond, MinBodyRate: rate})
	body := ignoredWebhook(announced - len(ignoredWebhook(0)))
	start := time.Now()
	conn := b.open(t, "/webhook", len(body), body[:sent])
	conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer to the body that stopped: %v", err)
	}
	resp.Body.Close()
	// 0.3 s + 100 KiB at 64 KiB/s is 1.9 s; counting the rest made it 16.3 s
	if took := time.Since(start); resp.StatusCode != http.StatusRequestTimeout || took > 8*time.Second {
		t.Errorf("a body that stopped after %d of %d bytes: %d after %v, want 408 within about 2 s", sent, len(body), resp.StatusCode, took.Round(time.Millisecond))
	}
	b.awaitInflight(t, 0)
}

// Whole bodies wait in line for their decoding share while others hold it,
// are never refused for it, and leave the line when their client hangs up.
// A small one (whole in its first 64 KiB, as every ordinary result) has a
// share of its own and is answered at once meanwhile: in one line with
// the large ones, three 30 MB steps held small results up for seconds.
func TestWholeBodiesWaitForTheirDecodingShareAndLeaveWhenTheirClientGoes(t *testing.T) {
	store := blockingStore{entered: make(chan struct{}), release: make(chan struct{})}
	const budget = 256 << 10 // an eighth for small bodies, 224 KiB for large ones
	b := newBudgetServer(t, httpapi.Config{Store: store, APIKey: apiKey, MaxBody: budget, MaxInflightBodyBytes: budget})

	// The first holds the large bodies' whole share in its handler (the store).
	first := postStepPadded(b.srv.URL, 100<<10)
	<-store.entered
	b.awaitInflight(t, budget-budget/8)

	// A second waits, unanswered, for as long as the first holds it.
	second := make(chan int, 1)
	go func() {
		status, _ := b.post(ignoredWebhook(80<<10), nil)
		second <- status
	}()
	// A third gives up while it waits, and leaves the line.
	ctx, cancel := context.WithCancel(context.Background())
	third := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", b.srv.URL+"/webhook", strings.NewReader(ignoredWebhook(80<<10)))
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		third <- err
	}()
	select {
	case status := <-second:
		t.Fatalf("the second request was answered %d while the first held the whole budget", status)
	case <-time.After(300 * time.Millisecond):
	}
	if status, took := b.post(ignoredWebhook(2<<10), nil); status != 200 || took > time.Second {
		t.Errorf("a small webhook while large bodies wait in line: %d after %v, want 200 at once", status, took)
	}
	cancel()
	if err := <-third; err == nil {
		t.Error("the third request was answered although its client gave up")
	}

	close(store.release)
	if status := <-first; status != 201 {
		t.Errorf("first: %d, want 201", status)
	}
	select {
	case status := <-second:
		if status != 200 {
			t.Errorf("second: %d, want 200", status)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second request was not answered once the budget was free")
	}
	b.awaitInflight(t, 0)
}

// blockingStore holds StoreStepID until release is closed.
type blockingStore struct {
	httpapi.Store
	entered chan struct{}
	release chan struct{}
}

func (s blockingStore) StoreStepID(context.Context, *nanostorage.StepEnqueuingWithConfig, time.Time) (int64, error) {
	close(s.entered)
	<-s.release
	return 1, nil
}

// A request that waited for the budget longer than the server's read and
// write timeouts still has its body read and its answer written: waiting
// costs no result.
func TestBodyBudgetWaitDoesNotCostARequestItsTimeouts(t *testing.T) {
	store := blockingStore{entered: make(chan struct{}), release: make(chan struct{})}
	const timeout = 500 * time.Millisecond
	h := httpapi.New(httpapi.Config{Store: store, APIKey: apiKey, Logger: zerolog.New(zerolog.NewTestWriter(t)),
		MaxBody: 64 << 10, MaxInflightBodyBytes: 64 << 10, BodyTimeout: 10 * time.Second})
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = timeout, timeout
	srv.Start()
	defer srv.Close()

	// The first holds the whole share of small bodies in its handler (the store).
	first := postStepPadded(srv.URL, 20<<10)
	<-store.entered

	// The second, larger than what the server reads with its headers,
	// waits past both timeouts.
	second := make(chan string, 1)
	go func() {
		resp, err := http.Post(srv.URL+"/webhook", "application/json", strings.NewReader(`{"topic":"mdm.TokenUpdate","pad":"`+strings.Repeat("x", 32<<10)+`"}`))
		if err != nil {
			second <- err.Error()
			return
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		second <- fmt.Sprintf("%d %s", resp.StatusCode, raw)
	}()
	select {
	case got := <-second:
		t.Fatalf("the second request was answered (%s) while the first held the budget", got)
	case <-time.After(3 * timeout):
	}
	// The first, stalled in the store past the write timeout without
	// having waited for anything, is cut off as any such request is.
	close(store.release)
	<-first
	select {
	case got := <-second:
		if got != "200 " {
			t.Errorf("second, after waiting past the timeouts: %q, want 200", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second request was not answered once the budget was free")
	}
}

// postStepPadded sends, in the background, a POST /v1/steps of one id and
// one command padded with pad spaces, and gives its status (-1: no answer).
func postStepPadded(url string, pad int) <-chan int {
	status := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("POST", url+"/v1/steps", strings.NewReader(string(testkit.V1StepJSON(1, 1))+strings.Repeat(" ", pad)))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			status <- -1
			return
		}
		resp.Body.Close()
		status <- resp.StatusCode
	}()
	return status
}
