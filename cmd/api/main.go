// Command api is stepcollect's HTTP service: NanoMDM's webhook in, steps
// and cancels from the workflow engine, health and metrics. Stateless: run
// any number of replicas behind a load balancer.
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
	cfg, flags, err := app.ParseAPIConfig(os.Args[1:], os.Getenv)
	if config.IsHelp(err) {
		flags.Usage(os.Stdout)
		return
	} else if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
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
	a, err := app.NewAPI(ctx, cfg, logger)
	if err != nil {
		logger.Error().Err(err).Msg("api: cannot start")
		os.Exit(1)
	}
	if err := a.Run(ctx); err != nil {
		logger.Error().Err(err).Msg("api: stopped with an error")
		os.Exit(1)
	}
}
