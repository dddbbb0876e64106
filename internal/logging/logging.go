// Package logging builds the binaries' zerolog logger.
package logging

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// New returns a logger writing to w at level ("debug", "info", "warn",
// "error") in format ("json", or "console" for people: coloured only when
// w is a terminal, so a file or a pipe gets no escape codes; NO_COLOR
// turns colour off anywhere).
func New(w io.Writer, level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("-log-level: %q is not one of debug, info, warn, error", level)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly, NoColor: !colour(w)}
	default:
		return zerolog.Nop(), fmt.Errorf("-log-format: %q is not json or console", format)
	}
	zerolog.TimeFieldFormat = time.RFC3339Nano
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// colour reports whether console output to w may carry colour codes.
func colour(w io.Writer) bool {
	if _, ok := os.LookupEnv("NO_COLOR"); ok {
		return false
	}
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}

// Asynq adapts a zerolog logger to asynq's Logger. While Redis is down
// each of asynq's loops logs its failure every second or so, four lines a
// second in all: after AsynqBurst warnings and errors in AsynqPeriod the
// rest of the period's are counted instead of written, and the count goes
// with the next line written (suppressed). Debug and info lines are not
// limited. Make one with NewAsynq; the zero value limits nothing.
type Asynq struct {
	L   zerolog.Logger
	lim *burstLimit
}

// The bound on asynq's warnings and errors (Asynq).
const (
	AsynqBurst  = 3
	AsynqPeriod = 30 * time.Second
)

// NewAsynq is Asynq on l, limited to AsynqBurst warnings and errors per
// AsynqPeriod.
func NewAsynq(l zerolog.Logger) Asynq {
	return Asynq{L: l, lim: &burstLimit{burst: AsynqBurst, period: AsynqPeriod, now: time.Now}}
}

func (a Asynq) Debug(args ...any) { a.L.Debug().Msg(fmt.Sprint(args...)) }
func (a Asynq) Info(args ...any)  { a.L.Info().Msg(fmt.Sprint(args...)) }
func (a Asynq) Warn(args ...any)  { a.limited(a.L.Warn(), args) }
func (a Asynq) Error(args ...any) { a.limited(a.L.Error(), args) }
func (a Asynq) Fatal(args ...any) { a.L.Fatal().Msg(fmt.Sprint(args...)) }

func (a Asynq) limited(ev *zerolog.Event, args []any) {
	if ev == nil {
		return // below the logger's level
	}
	if a.lim == nil {
		ev.Msg(fmt.Sprint(args...))
		return
	}
	ok, suppressed := a.lim.allow()
	if !ok {
		ev.Discard()
		return
	}
	if suppressed > 0 {
		ev = ev.Int("suppressed", suppressed)
	}
	ev.Msg(fmt.Sprint(args...))
}

// burstLimit lets burst events through per period and counts the rest.
type burstLimit struct {
	burst  int
	period time.Duration
	now    func() time.Time

	mu         sync.Mutex
	start      time.Time
	n          int // let through in the period from start
	suppressed int // not let through since the last that was
}

// allow reports whether one more event may go, and how many did not since
// the last that did.
func (b *burstLimit) allow() (bool, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now := b.now(); now.Sub(b.start) >= b.period {
		b.start, b.n = now, 0
	}
	if b.n >= b.burst {
		b.suppressed++
		return false, 0
	}
	b.n++
	s := b.suppressed
	b.suppressed = 0
	return true, s
}

// CPUProfile writes a pprof CPU profile to path until the returned function
// is called (STEPCOLLECT_CPU_PROFILE, for finding where time goes under
// load: go tool pprof -top <binary> <path>).
func CPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
