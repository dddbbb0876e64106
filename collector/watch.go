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

// WatchQueueLoss calls onLoss whenever the queue may have lost tasks: when
// Redis answers again after failing to, and when the server answering is
// another one than before (its run_id changed: restarted, without
// persistence its data gone; or a Sentinel failover promoted a replica,
// and what the old primary took in its last moments was not replicated).
// It looks every `every` until ctx ends. The worker sweeps in process on
// it, so that collect tasks lost with Redis cost seconds, not a sweep
// interval.
//
// marker is a key the watch keeps in Redis (tasks.QueueNames.Marker): its
// absence on the same server means the data was flushed. The first
// watcher to write it again is the one that notices, so every deployment
// on the Redis database has a marker of its own: with one shared, only
// the deployment whose worker looked first would sweep.
func WatchQueueLoss(ctx context.Context, r asynq.RedisConnOpt, marker string, every time.Duration, logger zerolog.Logger, onLoss func(reason string)) {
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
			markerSet, err = rc.SetNX(lctx, marker, id, 0).Result()
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

// ServerIdentifier names the database server that answers (host, port,
// server_id): the storage's ServerIdentity.
type ServerIdentifier interface {
	ServerIdentity(ctx context.Context) (string, error)
}

// WatchServer asks every interval which database server answers, until ctx
// ends, and calls onNew when one it has not seen before does: a promoted
// replica, another Galera node behind a balancer, a restored backup. A
// server that asynchronous replication made primary may lack what the old
// one committed last, collections included: the steps those deleted are
// back, unreferenced, and nothing hands them to a worker again. Only
// servers never seen count, so a pool whose connections still reach the
// old server and the new one by turns does not call onNew at every turn.
// A failed question is skipped (the next one asks again).
func WatchServer(ctx context.Context, db ServerIdentifier, every time.Duration, logger zerolog.Logger, onNew func(from, to string)) {
	t := time.NewTicker(every)
	defer t.Stop()
	seen := map[string]bool{}
	last := ""
	for {
		qctx, cancel := context.WithTimeout(ctx, max(every, time.Second))
		id, err := db.ServerIdentity(qctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			logger.Debug().Err(err).Msg("server watch: the database did not say which server it is; asking again")
		case !seen[id]:
			seen[id] = true
			if last != "" {
				onNew(last, id)
			}
			last = id
		default:
			last = id
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
