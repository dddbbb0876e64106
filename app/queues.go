package app

import (
	"context"
	"database/sql"
	"time"

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/metrics"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

// queueReader reads asynq's queues for metrics.QueueCollector, through an
// Inspector that gives up quickly when Redis is down (tasks.WithFastFailure).
// It reads this deployment's queues only, under their labels
// (asynq_queue_size{queue="stepcollect"}): another deployment's on the same
// Redis database are not its own.
type queueReader struct {
	insp *asynq.Inspector
	ns   *tasks.Namespace
}

var _ metrics.QueueReader = queueReader{}

func newQueueReader(r asynq.RedisConnOpt, ns *tasks.Namespace) queueReader {
	return queueReader{asynq.NewInspector(tasks.WithFastFailure(r)), ns}
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
func (q queueReader) QueueStats(label string) (metrics.QueueStats, error) {
	info, err := q.insp.GetQueueInfo(q.ns.Names().Name(label))
	if err != nil {
		return metrics.QueueStats{}, err
	}
	// asynq v0.26 documents Size as every state but completed, and adds
	// completed in: the sweeper's tasks are kept completed a while, and a
	// "queue not empty" alert on asynq_queue_size never cleared.
	return metrics.QueueStats{Size: max(0, info.Size-info.Completed), Latency: info.Latency, Pending: info.Pending, Active: info.Active,
		Scheduled: info.Scheduled, Retry: info.Retry, Archived: info.Archived, Completed: info.Completed}, nil
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
