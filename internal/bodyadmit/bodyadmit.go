// Package bodyadmit reads request bodies whole into memory under a budget
// that no client can hold without sending: the api's webhook and
// POST /v1/steps and the drop-in's webhook (docs/reference.md, "Limits").
// No share is held for bytes that have not arrived: the first firstChunk
// bytes go into the request's own buffer; a larger body takes its size
// from the arrival pool and must keep arriving (Config.Grace, MinRate);
// a whole body holds its decoding share until its handler returns, from a
// pool of its own if it fit the first chunk. The steps and why:
// docs/design.md, "How a body is admitted".
package bodyadmit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sync/semaphore"
)

const firstChunk = 64 << 10

// DefaultGrace and DefaultMinRate are how a body must keep arriving: a
// 32 MiB result has 10 s + 128 s.
const (
	DefaultGrace   = 10 * time.Second
	DefaultMinRate = 256 << 10 // bytes per second
)

// WorkingSetFactor is how many bytes of memory reading and decoding a body
// of n bytes holds at its peak, per byte of n. Measured for a 24 MiB
// webhook body (a result padded with one <data> element) through the api's
// DecodeWebhook with internal/mdmplist: 8.8 bytes allocated per body byte,
// about 5 live at the peak (heap sampled at GOGC=2). The body (1) and the
// decoded raw_payload (0.75) are inherent; the rest is the XML scanner's
// copies of the <data> text. A /v1/steps body is weighed the same: its lists
// are counted before they are built.
const WorkingSetFactor = 5

// Config is an Admitter's limits.
type Config struct {
	// MaxBody is the largest body: over it, Admit's error is an
	// *http.MaxBytesError.
	MaxBody int64
	// Budget is the working memory of the bodies read and decoded at once
	// (at least MaxBody).
	Budget int64
	// Timeout is the longest a body waits for its arrival share, and the
	// write deadline its answer gets once the body is whole.
	Timeout time.Duration
	// Grace and MinRate (bytes per second) are how a body must keep
	// arriving: each read's deadline allows Grace plus what has arrived at
	// MinRate. 0: DefaultGrace, DefaultMinRate.
	Grace   time.Duration
	MinRate int64
	// BudgetName names the budget in the answers of requests that waited
	// for it too long (the api: its flag).
	BudgetName string
	// Gauge, if not nil, is set to the bytes of the budget in use.
	Gauge prometheus.Gauge
}

// Error is a body that could not be admitted: the status to answer with and
// a one-line message that says why.
type Error struct {
	Status int
	Msg    string
}

func (e *Error) Error() string { return e.Msg }

// Admitter reads bodies under one budget.
type Admitter struct {
	cfg    Config
	budget *budget
}

// New returns an Admitter for cfg.
func New(cfg Config) *Admitter {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	if cfg.MinRate <= 0 {
		cfg.MinRate = DefaultMinRate
	}
	if cfg.BudgetName == "" {
		cfg.BudgetName = "the in-flight body budget"
	}
	cfg.Budget = max(cfg.Budget, cfg.MaxBody)
	return &Admitter{cfg: cfg, budget: newBudget(cfg.Budget, cfg.Gauge)}
}

// Admit returns r's whole body and the function that gives back its share of
// the budget (nil when it holds none), to call when the request's handler
// returns; or why the body was not admitted: an *http.MaxBytesError or an
// *Error.
func (a *Admitter) Admit(w http.ResponseWriter, r *http.Request) ([]byte, func(), error) {
	n := r.ContentLength
	switch {
	case n > a.cfg.MaxBody:
		return nil, nil, &http.MaxBytesError{Limit: a.cfg.MaxBody}
	case n == 0:
		return nil, nil, nil
	}
	rc := http.NewResponseController(w)
	// a chunked body is cut off at the limit (the api's middleware bounds
	// every body already; a second bound costs nothing there)
	src := &paced{r: http.MaxBytesReader(w, r.Body, a.cfg.MaxBody), rc: rc, declared: n, grace: a.cfg.Grace, rate: a.cfg.MinRate}
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
		return a.decodingShare(rc, r, first[:got], nil)
	default:
		return nil, nil, src.failed(err, int64(got))
	}

	size := n
	if n < 0 {
		size = a.cfg.MaxBody // the most it can be
	}
	weight := min(size, a.budget.arrivingSize)
	wctx, cancel := context.WithTimeout(r.Context(), a.cfg.Timeout)
	waited, err := a.budget.take(wctx, a.budget.arriving, weight)
	cancel()
	if err != nil {
		return nil, nil, a.waitFailed(r, err, "arrival")
	}
	giveBack := func() { a.budget.give(a.budget.arriving, weight) }
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
	return a.decodingShare(rc, r, body, giveBack)
}

// decodingShare waits for body's decoding share, then gives back its
// arrival share (giveBack, nil for a body that held none: one whole in its
// first chunk, whose share comes from the small bodies' pool).
func (a *Admitter) decodingShare(rc *http.ResponseController, r *http.Request, body []byte, giveBack func()) ([]byte, func(), error) {
	pool, size := a.budget.decoding, a.budget.decodingSize
	if giveBack == nil {
		pool, size = a.budget.small, a.budget.smallSize
	}
	weight := min(int64(len(body))*WorkingSetFactor, size)
	_, err := a.budget.take(r.Context(), pool, weight)
	if giveBack != nil {
		giveBack()
	}
	if err != nil {
		return nil, nil, a.waitFailed(r, err, "decoding")
	}
	// However long the body took, its answer gets the whole Timeout. An
	// error means the connection cannot; it keeps the server's.
	rc.SetReadDeadline(time.Time{})
	rc.SetWriteDeadline(time.Now().Add(a.cfg.Timeout))
	return body, func() { a.budget.give(pool, weight) }, nil
}

// waitFailed is the error of a request that stopped waiting for a share:
// its client hung up (nobody reads the answer; 408 keeps the log line and
// the metrics honest), or it waited Timeout for its arrival share.
func (a *Admitter) waitFailed(r *http.Request, err error, pool string) error {
	zerolog.Ctx(r.Context()).Info().Err(err).Str("pool", pool).Msg("request ended while waiting for the in-flight body budget")
	if r.Context().Err() != nil {
		return &Error{Status: http.StatusRequestTimeout, Msg: "body: not read; the request ended while it waited for " + a.cfg.BudgetName}
	}
	return &Error{Status: http.StatusServiceUnavailable, Msg: fmt.Sprintf("body: waited %v for %s while other bodies arrived; nothing was written, retry later", a.cfg.Timeout, a.cfg.BudgetName)}
}

// paced reads a body that must keep arriving: each read's deadline allows
// grace plus what has arrived so far at rate, counted from the last restart.
// What a read asks for does not count: a read of the rest of a 32 MiB body
// would otherwise be given 128 s more at 256 KiB/s before its first byte,
// and a client that stopped sending would hold its share that long.
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
	allowed := p.grace + time.Duration(float64(p.got)/float64(p.rate)*float64(time.Second))
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
		return &Error{Status: http.StatusRequestTimeout, Msg: fmt.Sprintf("body: arrived too slowly (%d bytes in; a body must arrive at %d bytes/s after its first %v)", got, p.rate, p.grace)}
	case p.declared > 0 && (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)):
		return &Error{Status: http.StatusBadRequest, Msg: fmt.Sprintf("body: ended after %d of the %d bytes its Content-Length announced", got, p.declared)}
	default:
		return &Error{Status: http.StatusBadRequest, Msg: "body: could not be read whole: " + OneLine(err.Error())}
	}
}

// budget is Config.Budget as weighted semaphores: bodies arriving (each
// its size, half the budget in all) and bodies being decoded and handled
// (each WorkingSetFactor x its size, the whole budget: an eighth for the
// bodies whole in their first chunk, the rest for larger ones), with one
// gauge of what they hold.
type budget struct {
	arriving, decoding, small             *semaphore.Weighted
	arrivingSize, decodingSize, smallSize int64
	used                                  atomic.Int64
	gauge                                 prometheus.Gauge // nil without metrics
}

func newBudget(size int64, gauge prometheus.Gauge) *budget {
	a, s := max(size/2, 1), max(size/8, 1)
	d := max(size-s, 1)
	return &budget{
		arriving: semaphore.NewWeighted(a), arrivingSize: a,
		decoding: semaphore.NewWeighted(d), decodingSize: d,
		small: semaphore.NewWeighted(s), smallSize: s,
		gauge: gauge,
	}
}

// take waits in line for n of pool until they are free or ctx ends; waited
// reports whether it had to wait.
func (b *budget) take(ctx context.Context, pool *semaphore.Weighted, n int64) (waited bool, err error) {
	if !pool.TryAcquire(n) {
		waited = true
		if err := pool.Acquire(ctx, n); err != nil {
			return true, err
		}
	}
	b.observe(n)
	return waited, nil
}

func (b *budget) give(pool *semaphore.Weighted, n int64) {
	pool.Release(n)
	b.observe(-n)
}

func (b *budget) observe(delta int64) {
	used := b.used.Add(delta)
	if b.gauge != nil {
		b.gauge.Set(float64(used))
	}
}

// OneLine keeps a message (which may quote input or a read error) on one
// line and bounded to 200 bytes; the api's messages use it too.
func OneLine(s string) string { return OneLineMax(s, 200) }

// OneLineMax is OneLine bounded to max bytes, cut where a character
// starts, "…" marking the cut.
func OneLineMax(s string, max int) string {
	s = strings.Map(func(r rune) rune {
		if r < 0x20 {
			return ' '
		}
		return r
	}, s)
	if len(s) > max {
		cut := max
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return s
}
