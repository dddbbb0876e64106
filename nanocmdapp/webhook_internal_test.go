package nanocmdapp

import (
	"bufio"
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/micromdm/nanolib/log"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
)

// bodyServer serves webhookBody in front of a handler that records the
// bodies it is given.
type bodyServer struct {
	*httptest.Server
	reached atomic.Int32
	last    atomic.Value // []byte
}

// idle is a webhook body NanoCMD's handler takes: an Idle report.
const idle = `{"topic":"mdm.Connect","acknowledge_event":{"udid":"DEV-1","status":"Idle"}}`

// testMaxBody is the limit the tests serve: the real one's 32 MiB would
// take seconds to send under -race.
const testMaxBody = 64 << 10

func newBodyServer(t *testing.T, key []byte, timeout time.Duration) *bodyServer {
	t.Helper()
	return newBodyServerOf(t, timeout, func(next http.Handler, bodies *bodyadmit.Admitter) http.Handler {
		return webhookBody(next, key, bodies, log.NopLogger)
	})
}

// newBodyServerOf is newBodyServer with the body read by wrap's handler.
func newBodyServerOf(t *testing.T, timeout time.Duration, wrap func(http.Handler, *bodyadmit.Admitter) http.Handler) *bodyServer {
	t.Helper()
	s := &bodyServer{}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.last.Store(b)
		s.reached.Add(1)
	})
	bodies := bodyadmit.New(bodyadmit.Config{MaxBody: testMaxBody, Budget: 4 * testMaxBody, Timeout: timeout, Grace: timeout})
	s.Server = httptest.NewUnstartedServer(wrap(next, bodies))
	s.Config.ReadTimeout = timeout
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// raw sends head (the request line and headers, without the blank line),
// then whatever send writes, and returns the status line and body of the
// answer, read within 15 s.
func (s *bodyServer) raw(t *testing.T, head string, send func(io.Writer)) (string, string) {
	t.Helper()
	c, err := net.Dial("tcp", s.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	if _, err := io.WriteString(c, head+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if send != nil {
		// the server may answer and close before all of it is written
		go send(c)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, strings.TrimSpace(string(b))
}

func TestWebhookBodyOverTheLimitIsRefusedBeforeNanoCMDsHandler(t *testing.T) {
	over := fmt.Sprintf("webhook body over %d bytes", testMaxBody)
	for _, key := range [][]byte{nil, []byte("key")} {
		s := newBodyServer(t, key, time.Minute)
		t.Run(fmt.Sprintf("key %q, declared and never sent", key), func(t *testing.T) {
			// answered at once, without waiting for a byte of it
			status, body := s.raw(t, fmt.Sprintf("POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d", testMaxBody+1), nil)
			if !strings.HasPrefix(status, "413") || body != over {
				t.Errorf("got %s %q, want 413 %q", status, body, over)
			}
		})
		t.Run(fmt.Sprintf("key %q, chunked", key), func(t *testing.T) {
			status, body := s.raw(t, "POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked", func(w io.Writer) {
				cw := httputil.NewChunkedWriter(w)
				chunk := bytes.Repeat([]byte("A"), 4<<10)
				for i := 0; i <= testMaxBody/len(chunk); i++ {
					if _, err := cw.Write(chunk); err != nil {
						return
					}
				}
			})
			if !strings.HasPrefix(status, "413") || body != over {
				t.Errorf("got %s %q, want 413 %q", status, body, over)
			}
		})
		if n := s.reached.Load(); n != 0 {
			t.Errorf("key %q: NanoCMD's handler was reached %d times", key, n)
		}
	}
}

// A client that declares a body and sends part of it is answered 408 once
// the body's time is up, and NanoCMD's handler never sees it.
func TestWebhookBodyNotReceivedInTimeIsRefused(t *testing.T) {
	s := newBodyServer(t, nil, 300*time.Millisecond)
	start := time.Now()
	status, body := s.raw(t, "POST /webhook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100", func(w io.Writer) {
		io.WriteString(w, `{"topic":`)
	})
	if want := "webhook body: arrived too slowly (9 bytes in; a body must arrive at 262144 bytes/s after its first 300ms)"; !strings.HasPrefix(status, "408") || body != want {
		t.Errorf("got %s %q, want 408 %q", status, body, want)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("answered after %v", took)
	}
	if n := s.reached.Load(); n != 0 {
		t.Errorf("NanoCMD's handler was reached %d times", n)
	}
}

// A body within the limit reaches NanoCMD's handler whole; with a key, only
// with NanoMDM's signature over it.
func TestWebhookBodyWithinTheLimitReachesNanoCMDsHandler(t *testing.T) {
	key := []byte("key")
	body := []byte(`{"topic":"mdm.Connect","acknowledge_event":{"udid":"DEV-1","status":"Idle"}}`)
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	signed := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, tc := range []struct {
		name      string
		key       []byte
		signature string
		want      int
	}{
		{"no key", nil, "", http.StatusOK},
		{"signed", key, signed, http.StatusOK},
		{"unsigned", key, "", http.StatusUnauthorized},
		{"wrong signature", key, base64.StdEncoding.EncodeToString([]byte("wrong")), http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newBodyServer(t, tc.key, time.Minute)
			req, _ := http.NewRequest("POST", s.URL+"/webhook", bytes.NewReader(body))
			if tc.signature != "" {
				req.Header.Set("X-Hmac-Signature", tc.signature)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d", resp.StatusCode, tc.want)
			}
			reached := s.reached.Load() == 1
			if reached != (tc.want == http.StatusOK) {
				t.Fatalf("NanoCMD's handler reached: %v", reached)
			}
			if reached {
				if got, _ := s.last.Load().([]byte); !bytes.Equal(got, body) {
					t.Errorf("NanoCMD's handler got %q, want %q", got, body)
				}
			}
		})
	}
}

// A browser's POST to the webhook (a forged result in a text/plain form,
// with or without the HMAC key configured) is refused 403 before NanoCMD's
// handler; NanoMDM's sender sets neither header and passes.
func TestWebhookRefusesABrowsersPost(t *testing.T) {
	t.Parallel()
	s := newBodyServer(t, nil, time.Minute)
	body := `{"topic":"mdm.Connect","acknowledge_event":{"udid":"DEV-1","status":"Idle","raw_payload":"PHBsaXN0Lz4="}}`
	for _, h := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "https://evil.example"},
		{"Sec-Fetch-Site": "same-site", "Origin": "https://mdm.example"},
	} {
		req, _ := http.NewRequest("POST", s.URL+"/webhook", strings.NewReader(body))
		req.Header.Set("Content-Type", "text/plain")
		for k, v := range h {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), "browser") {
			t.Errorf("%v: %d %q, want 403 naming the browser", h, resp.StatusCode, b)
		}
	}
	if n := s.reached.Load(); n != 0 {
		t.Fatalf("NanoCMD's handler reached %d times, want 0", n)
	}
}

// The server's ReadTimeout ends with the body (net/http clears it once the
// body is read): NanoCMD's handler may run past it (a slow database,
// NanoMDM's enqueue API) without its request being cancelled.
func TestWebhookHandlerOutlivesTheReadTimeout(t *testing.T) {
	var ctxErr atomic.Value
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.ReadAll(r.Body)
		time.Sleep(600 * time.Millisecond)
		ctxErr.Store(fmt.Sprint(r.Context().Err()))
	})
	bodies := bodyadmit.New(bodyadmit.Config{MaxBody: testMaxBody, Budget: 4 * testMaxBody, Timeout: time.Minute})
	srv := httptest.NewUnstartedServer(webhookBody(next, nil, bodies, log.NopLogger))
	srv.Config.ReadTimeout = 200 * time.Millisecond
	srv.Start()
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/webhook", "application/json", strings.NewReader(idle))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d, want 200", resp.StatusCode)
	}
	if got := ctxErr.Load(); got != "<nil>" {
		t.Errorf("the handler's context after the read timeout: %v, want not cancelled", got)
	}
}

// Bodies are held under the budget while NanoCMD's handler runs: with a
// budget that one body's decoding share fills, a second body waits for the
// first handler to return, then goes through.
func TestWebhookBodiesWaitForTheBudget(t *testing.T) {
	inside := make(chan struct{}, 2)
	release := make(chan struct{})
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inside <- struct{}{}
		<-release
	})
	bodies := bodyadmit.New(bodyadmit.Config{MaxBody: testMaxBody, Budget: testMaxBody, Timeout: time.Minute})
	srv := httptest.NewServer(webhookBody(next, nil, bodies, log.NopLogger))
	defer srv.Close()
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	defer let() // before srv.Close, which waits for the handlers
	// 20 KiB, weighed 5 times over: the whole 64 KiB budget; JSON, as a
	// body must be to reach NanoCMD's handler
	body := []byte(idle[:len(idle)-1] + `,"pad":"` + strings.Repeat("A", 20<<10-len(idle)-9) + `"}`)
	done := make(chan int, 2)
	post := func() {
		resp, err := http.Post(srv.URL+"/webhook", "application/json", bytes.NewReader(body))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}
	go post()
	<-inside
	go post()
	select {
	case <-inside:
		t.Fatal("a second body reached NanoCMD's handler while the first held the whole budget")
	case <-time.After(500 * time.Millisecond):
	}
	let()
	select {
	case <-inside:
	case <-time.After(15 * time.Second):
		t.Fatal("the second body did not reach NanoCMD's handler once the first was answered")
	}
	for range 2 {
		if code := <-done; code != http.StatusOK {
			t.Errorf("status %d, want 200", code)
		}
	}
}
