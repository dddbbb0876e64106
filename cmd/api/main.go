// Command api is stepcollect's HTTP service: NanoMDM's webhook in, steps
// and cancels from the workflow engine, health and metrics. Stateless: run
// any number of replicas behind a load balancer.
package main

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/app"
)

func main() {
	app.Main("api", app.ParseAPIConfig,
		func(c app.APIConfig) (string, string) { return c.LogLevel, c.LogFormat },
		func(ctx context.Context, c app.APIConfig, l zerolog.Logger) (app.Service, error) {
			app.TuneAPIGC(c, l)
			return app.NewAPI(ctx, c, l)
		})
}
