package mysql

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

// ReadyCheck is /readyz's MySQL check for a process on db: Ready, then
// whether the schema has every migration this build embeds (CheckSchema).
// A process started with -migrate=false on a database nobody migrated, or
// before the one that migrates in an upgrade, can answer nothing but 503s
// until then, so it is not ready. Once the schema has passed it is not
// read again: migrations only ever go forward under a running build.
func ReadyCheck(db *sql.DB) func(context.Context) error {
	var schemaOK atomic.Bool
	return func(ctx context.Context) error {
		if err := Ready(ctx, db); err != nil {
			return err
		}
		if schemaOK.Load() {
			return nil
		}
		if err := CheckSchema(ctx, db); err != nil {
			return err
		}
		schemaOK.Store(true)
		return nil
	}
}

// CheckSchema says, naming both versions, when db's schema lacks a
// migration this build embeds. A schema ahead of the build (a newer
// replica migrated it during a rolling upgrade) passes: migrations add.
func CheckSchema(ctx context.Context, db *sql.DB) error {
	want, err := embeddedLatest()
	if err != nil {
		return err
	}
	var have sql.NullInt64
	err = db.QueryRowContext(ctx, qSchemaVersion).Scan(&have)
	switch {
	case mysqlErrNo(err) == errNoSuchTable, err == nil && have.Int64 <= 0:
		return fmt.Errorf("schema: not migrated (this build needs migration %d): start one process with -migrate=true", want)
	case err != nil:
		return fmt.Errorf("schema: reading %s: %w", MigrationsTable, err)
	case have.Int64 < want:
		return fmt.Errorf("schema: at migration %d, this build needs %d: start one process with -migrate=true", have.Int64, want)
	}
	return nil
}

// errNoSuchTable is "Table … doesn't exist".
const errNoSuchTable = 1146

// errBadField is "Unknown column": a schema older than the column read.
const errBadField = 1054

// embeddedLatest is the highest version among the embedded migrations,
// read from their names (00014_….sql) as goose reads them.
var embeddedLatest = sync.OnceValues(func() (int64, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return 0, fmt.Errorf("schema: listing the embedded migrations: %w", err)
	}
	var latest int64
	for _, e := range entries {
		prefix, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.ParseInt(prefix, 10, 64)
		if !ok || err != nil {
			return 0, fmt.Errorf("schema: embedded migration %s has no version in its name", e.Name())
		}
		latest = max(latest, v)
	}
	return latest, nil
})

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
