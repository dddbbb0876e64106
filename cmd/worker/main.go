// Command worker is stepcollect's asynq worker: it collects steps that
// nothing references any more, delivers events to the workflow engine,
// acts on step timeouts and not_until, and sweeps for what a lost enqueue
// left. Run any number of replicas.
package main

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
)

func main() {
	app.Main("worker", app.ParseWorkerConfig,
		func(c app.WorkerConfig) (string, string) { return c.LogLevel, c.LogFormat },
		func(ctx context.Context, c app.WorkerConfig, l zerolog.Logger) (app.Service, error) {
			app.TuneWorkerGC(l)
			return app.NewWorker(ctx, c, l)
		})
}
