// Command nanocmd is NanoCMD v0.7.1's server (the same flags, NANOCMD_*
// variables, routes and workflows) on stepcollect's storage: with -storage
// mysql the engine and every subsystem are in MySQL or MariaDB.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/micromdm/nanocmd/logkeys"
	"github.com/micromdm/nanolib/log/stdlogfmt"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/logging"
	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/nanocmdapp"
)

func main() { os.Exit(run()) }

// run is main, returning its exit code, so that deferred work (the CPU
// profile's end) happens on every way out.
func run() int {
	cfg, err := nanocmdapp.Parse(os.Args[0], os.Args[1:], os.Environ(), os.Stderr)
	if err == nanocmdapp.ErrHelp {
		return 0
	} else if err != nil {
		return 2
	}
	if cfg.Version {
		fmt.Println(version.Get().Version)
		return 0
	}
	logger := stdlogfmt.New(stdlogfmt.WithDebugFlag(cfg.Debug))
	level := zerolog.InfoLevel
	if cfg.Debug {
		level = zerolog.DebugLevel
	}
	zl := zerolog.New(os.Stderr).Level(level).With().Timestamp().Logger()
	if path := os.Getenv("STEPCOLLECT_CPU_PROFILE"); path != "" {
		// as the api's and the worker's: where the time goes, for the bench
		stopProfile, err := logging.CPUProfile(path)
		if err != nil {
			logger.Info(logkeys.Message, "STEPCOLLECT_CPU_PROFILE", logkeys.Error, err)
			return 2
		}
		defer stopProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := nanocmdapp.New(ctx, cfg, logger, zl)
	if err != nil {
		logger.Info(logkeys.Message, "starting", logkeys.Error, err)
		return 1
	}
	if err := srv.Run(ctx); err != nil {
		return 1
	}
	return 0
}
