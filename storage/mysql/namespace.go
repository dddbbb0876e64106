package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/stepcollect/stepcollect/events"
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

// EventIDSalt is the deployment's event id salt (migration 16): the same
// for every process on this database, random for each database, so that
// two databases never write an event of the same id (events.Salt). A
// row, or a salt, gone missing is written again (the first writer's
// value wins). A deadlock or lock wait with another process writing it
// at the same moment is tried again, a few times. On a schema without
// migration 16 it fails with CheckSchema's error.
func EventIDSalt(ctx context.Context, db *sql.DB) (events.Salt, error) {
	var err error
	for try := 0; try < 5; try++ {
		if try > 0 {
			select {
			case <-ctx.Done():
				return 0, fmt.Errorf("reading the event id salt (stepcollect_deployment): %w", ctx.Err())
			case <-time.After(time.Duration(try*20) * time.Millisecond):
			}
		}
		var salt events.Salt
		salt, err = readEventIDSalt(ctx, db)
		if err == nil || retryReason(err) == "" {
			return salt, err
		}
	}
	return 0, err
}

func readEventIDSalt(ctx context.Context, db *sql.DB) (events.Salt, error) {
	var salt sql.Null[uint64]
	err := db.QueryRowContext(ctx, qGetEventIDSalt).Scan(&salt)
	if errors.Is(err, sql.ErrNoRows) {
		// The row itself is gone: written again as QueueNamespace does.
		if _, err = db.ExecContext(ctx, qEnsureQueueNamespace); err == nil {
			err = db.QueryRowContext(ctx, qGetEventIDSalt).Scan(&salt)
		}
	}
	if err == nil && !salt.Valid {
		var b [8]byte
		if _, err = rand.Read(b[:]); err == nil {
			// 60 bits, as the migration's: any BIGINT UNSIGNED would do.
			if _, err = db.ExecContext(ctx, qEnsureEventIDSalt, binary.BigEndian.Uint64(b[:])>>4); err == nil {
				err = db.QueryRowContext(ctx, qGetEventIDSalt).Scan(&salt)
			}
		}
		if err == nil && !salt.Valid {
			err = errors.New("still NULL after writing it")
		}
	}
	if mysqlErrNo(err) == errNoSuchTable || mysqlErrNo(err) == errBadField {
		if serr := CheckSchema(ctx, db); serr != nil {
			return 0, serr
		}
	}
	if err != nil {
		return 0, fmt.Errorf("reading the event id salt (stepcollect_deployment): %w", err)
	}
	return events.Salt(salt.V), nil
}

// eventSalt is EventIDSalt, read once for the Storage's life: every event
// it writes, and every look for one after a lost COMMIT answer, uses the
// same. A failed read is tried again by the next caller.
func (s *Storage) eventSalt(ctx context.Context) (events.Salt, error) {
	if p := s.salt.Load(); p != nil {
		return *p, nil
	}
	s.saltMu.Lock()
	defer s.saltMu.Unlock()
	if p := s.salt.Load(); p != nil {
		return *p, nil
	}
	salt, err := EventIDSalt(ctx, s.db)
	if err != nil {
		return 0, err
	}
	s.salt.Store(&salt)
	return salt, nil
}
