// Package logging builds the binaries' zerolog logger.
package logging

import (
	"fmt"
	"io"
	"os"
	"runtime/pprof"
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

// Asynq adapts a zerolog logger to asynq's Logger.
type Asynq struct{ L zerolog.Logger }

func (a Asynq) Debug(args ...any) { a.L.Debug().Msg(fmt.Sprint(args...)) }
func (a Asynq) Info(args ...any)  { a.L.Info().Msg(fmt.Sprint(args...)) }
func (a Asynq) Warn(args ...any)  { a.L.Warn().Msg(fmt.Sprint(args...)) }
func (a Asynq) Error(args ...any) { a.L.Error().Msg(fmt.Sprint(args...)) }
func (a Asynq) Fatal(args ...any) { a.L.Fatal().Msg(fmt.Sprint(args...)) }

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
