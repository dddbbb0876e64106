package collector

import (
	"context"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/tasks"
)

// queueMarkerKey is a key the watch keeps in the queue's Redis: its absence
// on the same server means the data was flushed.
const queueMarkerKey = "stepcollect:queue_marker"

// WatchQueueLoss calls onLoss whenever the queue may have lost tasks: when
// Redis answers again after failing to, and when the server answering is
// another one than before (its run_id changed: restarted, without
// persistence its data gone; or a Sentinel failover promoted a replica,
// and what the old primary took in its last moments was not replicated).
// It looks every `every` until ctx ends. The worker sweeps in process on
// it, so that collect tasks lost with Redis cost seconds, not a sweep
// interval.
func WatchQueueLoss(ctx context.Context, r asynq.RedisConnOpt, every time.Duration, logger zerolog.Logger, onLoss func(reason string)) {
	rc, ok := tasks.WithFastFailure(r).MakeRedisClient().(redis.UniversalClient)
	if !ok {
		logger.Warn().Msg("queue loss watch: not a go-redis client; lost tasks wait for the next sweep")
		<-ctx.Done()
		return
	}
	defer rc.Close()
	t := time.NewTicker(every)
	defer t.Stop()
	down, runID := false, ""
	for {
		lctx, cancel := context.WithTimeout(ctx, every)
		info, err := rc.Info(lctx, "server").Result()
		id := infoField(info, "run_id")
		var markerSet bool
		if err == nil {
			markerSet, err = rc.SetNX(lctx, queueMarkerKey, id, 0).Result()
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil || id == "":
			down = true
		case down && runID != "":
			onLoss("redis answers again")
		case runID != "" && id != runID:
			onLoss("another redis server answers (restarted, or a failover)")
		case runID != "" && markerSet:
			onLoss("redis lost its data (the queue marker is gone)")
		}
		if err == nil && id != "" {
			down, runID = false, id
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// infoField reads one "name:value" line of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
