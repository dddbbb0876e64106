package nanocmdapp

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
)

func newAPIBodyServer(t *testing.T, timeout time.Duration) *bodyServer {
	t.Helper()
	return newBodyServerOf(t, timeout, func(next http.Handler, bodies *bodyadmit.Admitter) http.Handler {
		return apiBody(bodies)(next)
	})
}

// A keyed route's body over the limit is refused with a 413 naming it,
// declared or chunked, before NanoCMD's handler reads any of it (its
// profile handler reads a body of any size).
func TestAnAPIBodyOverTheLimitIsRefusedBeforeNanoCMDsHandler(t *testing.T) {
	s := newAPIBodyServer(t, time.Minute)
	over := fmt.Sprintf(`{"error":"body over %d bytes"}`, testMaxBody)
	status, body := s.raw(t, fmt.Sprintf("PUT /v1/profile/x HTTP/1.1\r\nHost: x\r\nContent-Length: %d", testMaxBody+1), nil)
	if !strings.HasPrefix(status, "413") || body != over {
		t.Errorf("declared: got %s %s, want 413 %s", status, body, over)
	}
	status, body = s.raw(t, "PUT /v1/profile/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked", func(w io.Writer) {
		cw := httputil.NewChunkedWriter(w)
		chunk := bytes.Repeat([]byte("A"), 4<<10)
		for i := 0; i <= testMaxBody/len(chunk); i++ {
			if _, err := cw.Write(chunk); err != nil {
				return
			}
		}
	})
	if !strings.HasPrefix(status, "413") || body != over {
		t.Errorf("chunked: got %s %s, want 413 %s", status, body, over)
	}
	if n := s.reached.Load(); n != 0 {
		t.Errorf("NanoCMD's handler was reached %d times", n)
	}
}

// A keyed route's body that arrives too slowly is answered 408 naming the
// pace, and NanoCMD's handler never sees it.
func TestAnAPIBodyNotReceivedInTimeIsRefused(t *testing.T) {
	s := newAPIBodyServer(t, 300*time.Millisecond)
	status, body := s.raw(t, "PUT /v1/cmdplan/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100", func(w io.Writer) {
		io.WriteString(w, `{"profile_names":`)
	})
	if want := `{"error":"body: arrived too slowly (17 bytes in; a body must arrive at 262144 bytes/s after its first 300ms)"}`; !strings.HasPrefix(status, "408") || body != want {
		t.Errorf("got %s %s, want 408 %s", status, body, want)
	}
	if n := s.reached.Load(); n != 0 {
		t.Errorf("NanoCMD's handler was reached %d times", n)
	}
}

// A body within the limit reaches NanoCMD's handler whole, and a request
// without one passes.
func TestAnAPIBodyWithinTheLimitReachesNanoCMDsHandler(t *testing.T) {
	s := newAPIBodyServer(t, time.Minute)
	body := []byte(`{"profile_names":["wifi"]}`)
	for _, b := range [][]byte{body, nil} {
		req, _ := http.NewRequest("PUT", s.URL+"/v1/cmdplan/x", bytes.NewReader(b))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got, _ := s.last.Load().([]byte); resp.StatusCode != http.StatusOK || !bytes.Equal(got, b) {
			t.Errorf("status %d, NanoCMD's handler got %q; want 200 and %q", resp.StatusCode, got, b)
		}
	}
}
