package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// RequestIDHeader carries the request id, in and out.
const RequestIDHeader = "X-Request-Id"

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

type ctxKey int

const requestIDKey ctxKey = iota

// RequestID returns the request id of ctx.
func RequestID(ctx context.Context) string {
	id, _ := ctx.Value(requestIDKey).(string)
	return id
}

// statusWriter remembers the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection (budgeted sets
// its deadlines).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// withRequest gives every request an id (the caller's X-Request-Id when it
// is sane), a logger carrying it, a body limit, an access log line, and
// turns a panic into a 500 whose log line has the id and the stack.
func withRequest(base zerolog.Logger, maxBody int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get(RequestIDHeader)
		if !requestIDPattern.MatchString(id) {
			b := make([]byte, 8)
			rand.Read(b)
			id = hex.EncodeToString(b)
		}
		w.Header().Set(RequestIDHeader, id)
		logger := base.With().Str(logkeys.RequestID, id).Logger()
		ctx := logger.WithContext(context.WithValue(r.Context(), requestIDKey, id))
		r = r.WithContext(ctx)
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		sw := &statusWriter{ResponseWriter: w}

		defer func() {
			if p := recover(); p != nil {
				if p == http.ErrAbortHandler {
					panic(p)
				}
				zerolog.Ctx(r.Context()).Error().Str("panic", fmt.Sprint(p)).Bytes("stack", debug.Stack()).Msg("handler panicked")
				if sw.status == 0 {
					writeError(sw, r, http.StatusInternalServerError, "internal error")
				}
			}
			ev := zerolog.Ctx(r.Context()).Debug()
			switch {
			case sw.status >= 500:
				ev = zerolog.Ctx(r.Context()).Warn()
			case sw.status >= 400:
				ev = zerolog.Ctx(r.Context()).Info()
			}
			ev.Str("method", r.Method).Str("path", r.URL.Path).Int("status", sw.status).
				Dur("took", time.Since(start)).Msg("request")
		}()
		next.ServeHTTP(sw, r)
	})
}

// errorBody is every error answer: one line naming the field or the
// conflicting row.
type errorBody struct {
	Error     string `json:"error"`
	RequestID string `json:"request_id,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	writeJSON(w, status, errorBody{Error: msg, RequestID: RequestID(r.Context())})
}

// statusOf is the one place domain errors become HTTP statuses. Anything
// that is not a domain error means the storage could not do its work
// (MySQL unreachable, mostly): 503, and nothing was half-written, because
// every change is one transaction.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case storage.ErrorCode(err) == storage.EInvalid:
		return http.StatusBadRequest
	case storage.ErrorCode(err) == storage.ETooLarge:
		return http.StatusRequestEntityTooLarge
	case storage.ErrorCode(err) == storage.EConflict:
		return http.StatusConflict
	case storage.ErrorCode(err) == storage.ENotFound:
		return http.StatusNotFound
	}
	return http.StatusServiceUnavailable
}

// respondError answers err with its status. Domain errors say what is
// wrong; others are logged in full and answered without internals.
func respondError(w http.ResponseWriter, r *http.Request, err error, what string) {
	status := statusOf(err)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeError(w, r, status, fmt.Sprintf("body: larger than the %d-byte limit (-max-body-bytes)", mbe.Limit))
	case status == http.StatusServiceUnavailable:
		zerolog.Ctx(r.Context()).Error().Err(err).Msg(what)
		writeError(w, r, status, what+": storage unavailable, nothing was written; retry later")
	default:
		writeError(w, r, status, oneLine(err.Error()))
	}
}

// bodyWorkingSetFactor is how many bytes of memory reading and decoding a
// body of n bytes holds at its peak, per byte of n. Measured for a 24 MiB
// webhook body (a result padded with one <data> element) through
// DecodeWebhook with internal/mdmplist: 8.8 bytes allocated per body byte,
// about 5 live at the peak (heap sampled at GOGC=2). The body (1) and the
// decoded raw_payload (0.75) are inherent; the rest is the XML scanner's
// copies of the <data> text while it checks it (encoding/xml's buffer, its
// own text and base64 buffers, the decoded bytes). A /v1/steps body is
// weighed the same: its lists are counted before they are built, so what
// decoding it holds is a few copies of its text (the decoder's buffer, a
// list's own decoder, the strings, the decoded commands).
const bodyWorkingSetFactor = 5

// bodyTooLarge refuses, before anything is read, a body whose
// Content-Length is over the limit.
func (s *Server) bodyTooLarge(r *http.Request) error {
	if r.ContentLength > s.cfg.MaxBody {
		return &http.MaxBytesError{Limit: s.cfg.MaxBody}
	}
	return nil
}

// budgeted holds a request's share of MaxInflightBodyBytes from before its
// body is read until h returns: Content-Length (NanoMDM sends it; the most
// the body can be otherwise) times bodyWorkingSetFactor, at most the whole
// budget. A request waits in line for its share rather than being refused:
// NanoMDM never resends, so a refused result is lost where a waiting one
// is only late. The wait ends with the request's context (the client gave
// up); a request that waited gets BodyTimeout again for its body and its
// answer.
func (s *Server) budgeted(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		n := r.ContentLength
		switch {
		case n > s.cfg.MaxBody || n == 0: // refused unread, or nothing to read
			h(w, r)
			return
		case n < 0:
			n = s.cfg.MaxBody
		}
		weight := s.budget.size
		if n <= weight/bodyWorkingSetFactor {
			weight = n * bodyWorkingSetFactor
		}
		waited, err := s.budget.acquire(r.Context(), weight)
		if err != nil {
			// Nobody is left to read an answer; 408 keeps the log line
			// and the metrics honest (a 200 would claim a commit).
			zerolog.Ctx(r.Context()).Info().Err(err).Int64("weight", weight).Msg("request ended while waiting for the in-flight body budget")
			writeError(w, r, http.StatusRequestTimeout, "body: not read; the request ended while it waited for the in-flight body budget (-max-inflight-body-bytes)")
			return
		}
		defer s.budget.release(weight)
		if waited {
			// An error means the connection cannot; it keeps the server's.
			rc := http.NewResponseController(w)
			deadline := time.Now().Add(s.cfg.BodyTimeout)
			rc.SetReadDeadline(deadline)
			rc.SetWriteDeadline(deadline)
		}
		h(w, r)
	}
}

// readBody reads a body whole. With a Content-Length (NanoMDM sends one)
// it reads into a buffer of exactly that size, where io.ReadAll's doubling
// would hold up to twice the body while it grows.
func (s *Server) readBody(r *http.Request) ([]byte, error) {
	if err := s.bodyTooLarge(r); err != nil {
		return nil, err
	}
	if r.ContentLength < 0 {
		return io.ReadAll(r.Body) // bounded by the MaxBytesReader
	}
	b := make([]byte, r.ContentLength)
	n, err := io.ReadFull(r.Body, b)
	switch {
	case err == nil:
		return b, nil
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return nil, invalid(fmt.Sprintf("body: ended after %d of the %d bytes its Content-Length announced", n, r.ContentLength))
	default:
		return nil, invalid("body: could not be read whole: " + oneLine(err.Error()))
	}
}

// bodyBudget is a weighted semaphore of body bytes in flight
// (golang.org/x/sync/semaphore: waiters are served in order, so a large
// body is not starved by a stream of small ones), with a gauge of what is
// held.
type bodyBudget struct {
	size  int64
	sem   *semaphore.Weighted
	used  atomic.Int64
	gauge prometheus.Gauge // nil without metrics
}

func newBodyBudget(size int64, gauge prometheus.Gauge) *bodyBudget {
	return &bodyBudget{size: size, sem: semaphore.NewWeighted(size), gauge: gauge}
}

// acquire takes n bytes (at most size) of the budget, waiting in line until
// they are free or ctx ends. waited reports whether it had to wait.
func (b *bodyBudget) acquire(ctx context.Context, n int64) (waited bool, err error) {
	if !b.sem.TryAcquire(n) {
		waited = true
		if err := b.sem.Acquire(ctx, n); err != nil {
			return true, err
		}
	}
	b.observe(n)
	return waited, nil
}

// release gives n bytes back.
func (b *bodyBudget) release(n int64) {
	b.sem.Release(n)
	b.observe(-n)
}

func (b *bodyBudget) observe(delta int64) {
	used := b.used.Add(delta)
	if b.gauge != nil {
		b.gauge.Set(float64(used))
	}
}
