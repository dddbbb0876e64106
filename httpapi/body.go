package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"
)

// How a webhook or /v1/steps body is admitted (docs/reference.md, "Limits").
// No share of the budget is held for bytes that have not arrived, so a
// client that sends headers and nothing holds nothing but its connection:
//
//  1. The first firstChunk bytes are read into the request's own buffer. A
//     body that fits (every ordinary MDM result) is then whole.
//  2. A larger body takes its size from the arrival pool (half the budget)
//     and reads the rest; it must keep arriving at Config.MinBodyRate after
//     Config.BodyGrace, or it is cut off with a 408 and gives its share back.
//  3. A whole body takes its decoding share (bodyWorkingSetFactor x its
//     size) from the decoding pool, gives back its arrival share, and holds
//     the decoding share until its handler returns. Waiting here ends when
//     the client hangs up: the body has been read to its end, so the server
//     watches the connection.
//
// Both pools serve their waiters in order (golang.org/x/sync/semaphore), so
// a large body is not starved by a stream of small ones; a body waiting for
// its decoding share has arrived whole, so nothing there waits on a client.
const firstChunk = 64 << 10

// DefaultBodyGrace and DefaultMinBodyRate are how a body must keep
// arriving: a 32 MiB result has 10 s + 128 s.
const (
	DefaultBodyGrace   = 10 * time.Second
	DefaultMinBodyRate = 256 << 10 // bytes per second
)

// bodyWorkingSetFactor is how many bytes of memory reading and decoding a
// body of n bytes holds at its peak, per byte of n. Measured for a 24 MiB
// webhook body (a result padded with one <data> element) through
// DecodeWebhook with internal/mdmplist: 8.8 bytes allocated per body byte,
// about 5 live at the peak (heap sampled at GOGC=2). The body (1) and the
// decoded raw_payload (0.75) are inherent; the rest is the XML scanner's
// copies of the <data> text. A /v1/steps body is weighed the same: its lists
// are counted before they are built.
const bodyWorkingSetFactor = 5

// bodyFunc is a handler that is given its body, read whole and admitted, or
// the reason it could not be (to answer with respondError).
type bodyFunc func(w http.ResponseWriter, r *http.Request, body []byte, err error)

// withBody reads the request's body as described above and hands it to h,
// holding its decoding share until h returns.
func (s *Server) withBody(h bodyFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, release, err := s.admitBody(w, r)
		if release != nil {
			defer release()
		}
		h(w, r, body, err)
	}
}

// bodyError is a body that could not be admitted, with its status.
type bodyError struct {
	status int
	msg    string
}

func (e *bodyError) Error() string { return e.msg }

// admitBody returns the whole body and the function that gives back its
// share of the budget (nil when it holds none).
func (s *Server) admitBody(w http.ResponseWriter, r *http.Request) ([]byte, func(), error) {
	n := r.ContentLength
	switch {
	case n > s.cfg.MaxBody:
		return nil, nil, &http.MaxBytesError{Limit: s.cfg.MaxBody}
	case n == 0:
		return nil, nil, nil
	}
	rc := http.NewResponseController(w)
	src := &paced{r: r.Body, rc: rc, declared: n, grace: s.cfg.BodyGrace, rate: s.cfg.MinBodyRate}
	src.restart()

	// A body of known length gets no more than it declared: a webhook is a
	// few KiB, and 64 KiB for each would be most of the api's garbage.
	chunk := int64(firstChunk)
	if n > 0 {
		chunk = min(n, chunk)
	}
	first := make([]byte, chunk)
	got, err := io.ReadFull(src, first)
	switch {
	case err == nil && (n < 0 || int64(got) < n):
		// more to come: step 2
	case err == nil, n < 0 && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		return s.decodingShare(rc, r, first[:got], nil)
	default:
		return nil, nil, src.failed(err, int64(got))
	}

	size := n
	if n < 0 {
		size = s.cfg.MaxBody // the most it can be
	}
	weight := min(size, s.budget.arrivingSize)
	wctx, cancel := context.WithTimeout(r.Context(), s.cfg.BodyTimeout)
	waited, err := s.budget.take(wctx, s.budget.arriving, weight)
	cancel()
	if err != nil {
		return nil, nil, s.budgetWaitFailed(r, err, "arrival")
	}
	giveBack := func() { s.budget.give(s.budget.arriving, weight) }
	if waited {
		src.restart() // the time it waited is not the client's
	}
	var body []byte
	if n > 0 {
		body = make([]byte, n)
		copy(body, first)
		m, err := io.ReadFull(src, body[got:])
		if err != nil {
			giveBack()
			return nil, nil, src.failed(err, int64(got+m))
		}
	} else {
		buf := bytes.NewBuffer(make([]byte, 0, 2*firstChunk))
		buf.Write(first)
		if _, err := buf.ReadFrom(src); err != nil {
			giveBack()
			return nil, nil, src.failed(err, int64(buf.Len()))
		}
		body = buf.Bytes()
	}
	return s.decodingShare(rc, r, body, giveBack)
}

// decodingShare waits for body's decoding share, then gives back its
// arrival share (giveBack, nil for a body that held none).
func (s *Server) decodingShare(rc *http.ResponseController, r *http.Request, body []byte, giveBack func()) ([]byte, func(), error) {
	weight := min(int64(len(body))*bodyWorkingSetFactor, s.budget.decodingSize)
	_, err := s.budget.take(r.Context(), s.budget.decoding, weight)
	if giveBack != nil {
		giveBack()
	}
	if err != nil {
		return nil, nil, s.budgetWaitFailed(r, err, "decoding")
	}
	// However long the body took, its answer gets the whole BodyTimeout.
	// An error means the connection cannot; it keeps the server's.
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Now().Add(s.cfg.BodyTimeout))
	return body, func() { s.budget.give(s.budget.decoding, weight) }, nil
}

// budgetWaitFailed is the error of a request that stopped waiting for a
// share: its client hung up (nobody reads the answer; 408 keeps the log line
// and the metrics honest), or it waited BodyTimeout for its arrival share.
func (s *Server) budgetWaitFailed(r *http.Request, err error, pool string) error {
	zerolog.Ctx(r.Context()).Info().Err(err).Str("pool", pool).Msg("request ended while waiting for the in-flight body budget")
	if r.Context().Err() != nil {
		return &bodyError{status: http.StatusRequestTimeout, msg: "body: not read; the request ended while it waited for the in-flight body budget (-max-inflight-body-bytes)"}
	}
	return &bodyError{status: http.StatusServiceUnavailable, msg: fmt.Sprintf("body: waited %v for the in-flight body budget (-max-inflight-body-bytes) while other bodies arrived; nothing was written, retry later", s.cfg.BodyTimeout)}
}

// paced reads a body that must keep arriving: each read's deadline allows
// grace plus what has arrived so far at rate, counted from the last restart.
type paced struct {
	r        io.Reader
	rc       *http.ResponseController
	declared int64
	grace    time.Duration
	rate     int64 // bytes per second
	start    time.Time
	got      int64 // since start
}

func (p *paced) restart() { p.start, p.got = time.Now(), 0 }

func (p *paced) Read(b []byte) (int, error) {
	allowed := p.grace + time.Duration(float64(p.got+int64(len(b)))/float64(p.rate)*float64(time.Second))
	p.rc.SetReadDeadline(p.start.Add(allowed)) // an error: the server's ReadTimeout stands
	n, err := p.r.Read(b)
	p.got += int64(n)
	return n, err
}

// failed names why a body could not be read whole, got bytes in.
func (p *paced) failed(err error, got int64) error {
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return err
	case errors.Is(err, os.ErrDeadlineExceeded):
		return &bodyError{status: http.StatusRequestTimeout, msg: fmt.Sprintf("body: arrived too slowly (%d bytes in; a body must arrive at %d bytes/s after its first %v)", got, p.rate, p.grace)}
	case p.declared > 0 && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		return invalid(fmt.Sprintf("body: ended after %d of the %d bytes its Content-Length announced", got, p.declared))
	default:
		return invalid("body: could not be read whole: " + oneLine(err.Error()))
	}
}

// bodyBudget is -max-inflight-body-bytes as two weighted semaphores: bodies
// arriving (each its size, half the budget in all) and bodies being decoded
// and handled (each bodyWorkingSetFactor x its size, the whole budget), with
// one gauge of what both hold.
type bodyBudget struct {
	arriving, decoding         *semaphore.Weighted
	arrivingSize, decodingSize int64
	used                       atomic.Int64
	gauge                      prometheus.Gauge // nil without metrics
}

func newBodyBudget(size int64, gauge prometheus.Gauge) *bodyBudget {
	a := max(size/2, 1)
	return &bodyBudget{
		arriving: semaphore.NewWeighted(a), arrivingSize: a,
		decoding: semaphore.NewWeighted(size), decodingSize: size,
		gauge: gauge,
	}
}

// take waits in line for n of pool until they are free or ctx ends; waited
// reports whether it had to wait.
func (b *bodyBudget) take(ctx context.Context, pool *semaphore.Weighted, n int64) (waited bool, err error) {
	if !pool.TryAcquire(n) {
		waited = true
		if err := pool.Acquire(ctx, n); err != nil {
			return true, err
		}
	}
	b.observe(n)
	return waited, nil
}

func (b *bodyBudget) give(pool *semaphore.Weighted, n int64) {
	pool.Release(n)
	b.observe(-n)
}

func (b *bodyBudget) observe(delta int64) {
	used := b.used.Add(delta)
	if b.gauge != nil {
		b.gauge.Set(float64(used))
	}
}
