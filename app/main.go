// Package app wires stepcollect's parts into the two services. cmd/api and
// cmd/worker only parse configuration, start one of these and stop it on a
// signal; tests start the same types on free ports.
package app

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/internal/logging"
	"github.com/stepcollect/stepcollect/internal/version"
)

// Service is what Main runs until a signal.
type Service interface {
	Run(ctx context.Context) error
}

// Main is all of cmd/api's and cmd/worker's main: parse the flags (exit 2
// with one line naming a bad one), build the logger, optionally profile
// (STEPCOLLECT_CPU_PROFILE), start the service and run it until SIGINT or
// SIGTERM.
func Main[C any](name string, parse func([]string, func(string) string) (C, *config.Set, error),
	logs func(C) (level, format string), start func(context.Context, C, zerolog.Logger) (Service, error)) {
	os.Exit(run(name, parse, logs, start))
}

// run is Main's body; its defers (the profile, the signal handler) run
// before Main exits with the code it returns.
func run[C any](name string, parse func([]string, func(string) string) (C, *config.Set, error),
	logs func(C) (level, format string), start func(context.Context, C, zerolog.Logger) (Service, error)) int {
	cfg, flags, err := parse(os.Args[1:], os.Getenv)
	if config.IsHelp(err) { // -h, or -version (Usage writes its line)
		flags.Usage(os.Stdout)
		return 0
	} else if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		return 2
	}
	if p, _ := flags.Lookup("probe"); p == "true" {
		return probe(flags, os.Stdout, os.Stderr)
	}
	level, format := logs(cfg)
	logger, _ := logging.New(os.Stderr, level, format)
	v := version.Get()
	logger.Info().Str("version", v.Version).Str("commit", v.Commit).Str("built", v.Date).Str("go_version", v.GoVersion).Msg(name + " starting")
	if path := os.Getenv("STEPCOLLECT_CPU_PROFILE"); path != "" {
		stop, err := logging.CPUProfile(path)
		if err != nil {
			logger.Error().Err(err).Msg("STEPCOLLECT_CPU_PROFILE")
			return 2
		}
		defer stop()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	svc, err := start(ctx, cfg, logger)
	if err != nil && ctx.Err() != nil {
		// the signal came while it waited for MySQL, or migrated
		logger.Info().Err(err).Msg(name + " stopped before it started")
		return 0
	}
	if err != nil {
		logger.Error().Err(err).Msg(name + ": cannot start")
		return 1
	}
	if err := svc.Run(ctx); err != nil {
		logger.Error().Err(err).Msg(name + ": stopped with an error")
		return 1
	}
	return 0
}
