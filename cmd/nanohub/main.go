// Command nanohub is NanoHUB v0.2.0's server (the same flags, NANOHUB_*
// variables, routes and auth, NanoMDM and KMFDDM in process) with NanoCMD's
// engine on stepcollect's storage: with -storage mysql the engine and every
// workflow's subsystem are in MySQL.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/micromdm/nanolib/log/stdlogfmt"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/nanohubapp"
)

func main() { os.Exit(run()) }

func run() int {
	cfg, err := nanohubapp.Parse(os.Args[0], os.Args[1:], os.Environ(), os.Stderr)
	if err == nanohubapp.ErrHelp {
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

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := nanohubapp.New(ctx, cfg, logger, zl)
	if err != nil {
		logger.Info("err", err)
		return 1
	}
	if err := srv.Run(ctx); err != nil {
		return 3
	}
	return 0
}
