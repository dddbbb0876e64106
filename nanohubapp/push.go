package nanohubapp

import (
	"context"

	"github.com/micromdm/nanolib/log"
	"github.com/micromdm/nanolib/log/ctxlog"
	"github.com/micromdm/nanomdm/push"

	"github.com/stepcollect/stepcollect/metrics"
)

// bestEffortPusher is the pusher behind NanoHUB's in-process enqueuer: a
// push that fails is logged and counted, never returned. NanoMDM's enqueuer
// reports a push error as the enqueue's error, so a workflow start whose
// push failed answered 500 after its first command was queued, and a step's
// later commands were never enqueued; the device gets every command at its
// next check-in, and the engine worker re-pushes.
type bestEffortPusher struct {
	push.Pusher
	metrics *metrics.MDM
	logger  log.Logger
}

func (p bestEffortPusher) Push(ctx context.Context, ids []string) (map[string]*push.Response, error) {
	res, err := p.Pusher.Push(ctx, ids)
	failed := 0
	for id, r := range res {
		if r != nil && r.Err != nil {
			failed++
			ctxlog.Logger(ctx, p.logger).Info("msg", "push failed; the command stays queued", "id", id, "err", r.Err)
			r.Err = nil
		}
	}
	if err != nil {
		failed = len(ids)
		ctxlog.Logger(ctx, p.logger).Info("msg", "push failed; the commands stay queued", "id_count", len(ids), "err", err)
	}
	p.metrics.PushFailed(failed)
	return res, nil
}
