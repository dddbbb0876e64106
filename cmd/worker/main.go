// Command worker is stepcollect's asynq worker: it collects steps that
// nothing references any more, and sweeps for what a lost enqueue left.
// Run any number of replicas.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/stepcollect/stepcollect/app"
	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/internal/logging"
)

func main() {
	cfg, flags, err := app.ParseWorkerConfig(os.Args[1:], os.Getenv)
	if config.IsHelp(err) {
		flags.Usage(os.Stdout)
		return
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	logger, _ := logging.New(os.Stderr, cfg.LogLevel, cfg.LogFormat)
	if path := os.Getenv("STEPCOLLECT_CPU_PROFILE"); path != "" {
		stopProfile, err := logging.CPUProfile(path)
		if err != nil {
			logger.Error().Err(err).Msg("STEPCOLLECT_CPU_PROFILE")
			os.Exit(2)
		}
		defer stopProfile()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	w, err := app.NewWorker(ctx, cfg, logger)
	if err != nil {
		logger.Error().Err(err).Msg("worker: cannot start")
		os.Exit(1)
	}
	if err := w.Run(ctx); err != nil {
		logger.Error().Err(err).Msg("worker: stopped with an error")
		os.Exit(1)
	}
}
