package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// Ready reports whether db's server takes writes, for /readyz: it answers
// a ping and, when it is a Galera node, the node is in the cluster's
// primary component and ready (wsrep_ready). A node that has lost its
// quorum still answers pings, and SHOW and SET, but refuses every other
// statement (1047, "WSREP has not yet prepared node for application use"):
// readiness on a ping alone would keep a load balancer sending it webhooks
// it can only answer 503 (docs/operations.md, "Database clusters").
func Ready(ctx context.Context, db *sql.DB) error {
	if err := db.PingContext(ctx); err != nil {
		return err
	}
	var name, on string
	err := db.QueryRowContext(ctx, qWsrepOn).Scan(&name, &on)
	if errors.Is(err, sql.ErrNoRows) {
		return nil // MySQL: no such variable
	} else if err != nil {
		return fmt.Errorf("asking whether the server is a Galera node: %w", err)
	}
	if on != "ON" {
		return nil
	}
	rows, err := db.QueryContext(ctx, qWsrepState)
	if err != nil {
		return fmt.Errorf("reading the Galera node's state: %w", err)
	}
	defer rows.Close()
	st := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return fmt.Errorf("reading the Galera node's state: %w", err)
		}
		st[k] = v
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("reading the Galera node's state: %w", err)
	}
	if st["wsrep_ready"] != "ON" || st["wsrep_cluster_status"] != "Primary" {
		return fmt.Errorf("this Galera node takes no writes: wsrep_ready %s, cluster status %s (%s), cluster size %s: it is not in the primary component (no quorum?)",
			cmp.Or(st["wsrep_ready"], "?"), cmp.Or(st["wsrep_cluster_status"], "?"), cmp.Or(st["wsrep_local_state_comment"], "?"), cmp.Or(st["wsrep_cluster_size"], "?"))
	}
	return nil
}

// ServerIdentity names the server that answers: its host, port and
// server_id. The worker watches it (collector.WatchServer) to sweep at
// once when another server starts answering, as after a failover.
func (s *Storage) ServerIdentity(ctx context.Context) (string, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	var id string
	if err := s.db.QueryRowContext(ctx, qServerIdentity).Scan(&id); err != nil {
		return "", fmt.Errorf("asking which server answers: %w", err)
	}
	return id, nil
}
