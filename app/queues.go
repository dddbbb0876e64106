package app

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/metrics"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

// queueReader reads asynq's queues for metrics.QueueCollector, through a
// client that gives up quickly when Redis is down (tasks.WithFastFailure).
// It reads this deployment's queues only, under their labels
// (asynq_queue_size{queue="stepcollect"}): another deployment's on the same
// Redis database are not its own.
type queueReader struct {
	insp *asynq.Inspector
	rc   redis.UniversalClient // nil when asynq made another kind of client
	ns   *tasks.Namespace
}

var _ metrics.QueueReader = queueReader{}

func newQueueReader(r asynq.RedisConnOpt, ns *tasks.Namespace) queueReader {
	r = tasks.WithFastFailure(r)
	rc, _ := r.MakeRedisClient().(redis.UniversalClient)
	return queueReader{asynq.NewInspector(r), rc, ns}
}

// Queues implements metrics.QueueReader: the labels of this deployment's
// queues that exist.
func (q queueReader) Queues() ([]string, error) {
	all, err := q.insp.Queues()
	if err != nil {
		return nil, err
	}
	names := q.ns.Names()
	var out []string
	for _, name := range all {
		if l := names.Label(name); l != "" {
			out = append(out, l)
		}
	}
	return out, nil
}

// QueueStats implements metrics.QueueReader, for the queue labelled label.
// It counts asynq's lists itself: GetQueueInfo also samples task keys and
// fails while a kept task's key has expired and asynq's janitor has not yet
// dropped its id (hibiken/asynq#728), though Redis answers.
func (q queueReader) QueueStats(label string) (metrics.QueueStats, error) {
	if q.rc == nil {
		return metrics.QueueStats{}, errors.New("reading the queue: not a go-redis client")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	prefix := "asynq:{" + q.ns.Names().Name(label) + "}:" // asynq's internal/base key layout
	var pending, active, scheduled, retry, archived, completed *redis.IntCmd
	var oldest *redis.StringCmd
	_, err := q.rc.TxPipelined(ctx, func(p redis.Pipeliner) error {
		pending, active = p.LLen(ctx, prefix+"pending"), p.LLen(ctx, prefix+"active")
		scheduled, retry = p.ZCard(ctx, prefix+"scheduled"), p.ZCard(ctx, prefix+"retry")
		archived, completed = p.ZCard(ctx, prefix+"archived"), p.ZCard(ctx, prefix+"completed")
		oldest = p.LIndex(ctx, prefix+"pending", -1) // asynq pushes on the left
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return metrics.QueueStats{}, fmt.Errorf("reading queue %s: %w", label, err)
	}
	var latency time.Duration
	if id := oldest.Val(); id != "" {
		since, err := q.rc.HGet(ctx, prefix+"t:"+id, "pending_since").Int64()
		if err != nil && !errors.Is(err, redis.Nil) { // nil: it left the queue meanwhile
			return metrics.QueueStats{}, fmt.Errorf("reading queue %s: %w", label, err)
		}
		if since > 0 {
			latency = max(0, time.Since(time.Unix(0, since)))
		}
	}
	// Size is every state but completed: the sweeper's tasks are kept
	// completed a while, and a "queue not empty" alert would never clear.
	st := metrics.QueueStats{Latency: latency, Pending: int(pending.Val()), Active: int(active.Val()),
		Scheduled: int(scheduled.Val()), Retry: int(retry.Val()), Archived: int(archived.Val()), Completed: int(completed.Val())}
	st.Size = st.Pending + st.Active + st.Scheduled + st.Retry + st.Archived
	return st, nil
}

// readNamespace sets ns to the deployment's queue names, read from db, and
// reports whether it could. A database not migrated yet has none: the
// process serves /readyz (503, naming the schema) meanwhile, and
// awaitNamespace reads them once it can.
func readNamespace(ctx context.Context, db *sql.DB, ns *tasks.Namespace) error {
	qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := stepmysql.QueueNamespace(qctx, db)
	if err != nil {
		return err
	}
	ns.Set(tasks.NamesFor(v))
	return nil
}

// awaitNamespace tries readNamespace every second until it succeeds or ctx
// ends, and says once why it waits. It returns ctx's error, or nil once
// the names are set.
func awaitNamespace(ctx context.Context, db *sql.DB, ns *tasks.Namespace, logger zerolog.Logger) error {
	logged := false
	for !ns.Names().Known() {
		err := readNamespace(ctx, db, ns)
		if err == nil {
			logger.Info().Str("collect_queue", ns.Names().Collect).Msg("queue namespace read: the database is migrated")
			return nil
		}
		if !logged {
			logger.Warn().Err(err).Msg("waiting for the database's queue namespace; nothing is queued until then (the sweeper finds the work)")
			logged = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	return nil
}
