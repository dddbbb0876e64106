package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// QueueNamespace is the deployment's name for its queues in Redis
// (migration 15): the same for every process on this database, different
// for another database, so that deployments sharing a Redis database keep
// to their own tasks. A row gone missing is written again (the first
// writer's value wins). On a schema without migration 15 it fails with
// CheckSchema's error, which names what to do.
func QueueNamespace(ctx context.Context, db *sql.DB) (string, error) {
	var ns string
	err := db.QueryRowContext(ctx, qGetQueueNamespace).Scan(&ns)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err = db.ExecContext(ctx, qEnsureQueueNamespace); err == nil {
			err = db.QueryRowContext(ctx, qGetQueueNamespace).Scan(&ns)
		}
	}
	if mysqlErrNo(err) == errNoSuchTable {
		if serr := CheckSchema(ctx, db); serr != nil {
			return "", serr
		}
	}
	if err != nil {
		return "", fmt.Errorf("reading the queue namespace (stepcollect_deployment): %w", err)
	}
	return ns, nil
}
