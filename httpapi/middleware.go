package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"regexp"
	"runtime/debug"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/logkeys"
)

// RequestIDHeader carries the request id, in and out.
const RequestIDHeader = "X-Request-Id"

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

type ctxKey int

const (
	requestIDKey ctxKey = iota
	refusalKey
)

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

// Unwrap lets http.ResponseController reach the connection (withBody sets
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
		refusal := new(string) // what writeError answered, for the access log
		ctx := logger.WithContext(context.WithValue(context.WithValue(r.Context(), requestIDKey, id), refusalKey, refusal))
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
			case sw.status >= 400 && r.URL.Path == "/webhook":
				// NanoMDM does not resend: a refused result is lost, and
				// the operator needs to see why (runbook:
				// StepcollectResultsRejected).
				ev = zerolog.Ctx(r.Context()).Warn()
			case sw.status >= 400:
				ev = zerolog.Ctx(r.Context()).Info()
			}
			if *refusal != "" {
				ev = ev.Str("refusal", *refusal)
			}
			ev.Str("method", r.Method).Str("path", r.URL.Path).Int("status", sw.status).
				Dur("took_ms", time.Since(start)).Msg("request")
		}()
		next.ServeHTTP(sw, r)
	})
}
