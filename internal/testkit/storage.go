package testkit

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// NewStorage is a fresh migrated database of t's own (NewDB's, its pool
// of PoolSize) and the storage on it, built with opts: the setup most
// tests of the storage and of what sits on it start from.
func NewStorage(t testing.TB, opts ...stepmysql.Option) (*DB, *stepmysql.Storage) {
	t.Helper()
	db := NewDB(t, nil)
	return db, OpenStorage(t, db.DB, opts...)
}

// OpenStorage is the storage on pool, built with opts (after WithDB(pool),
// so that they may override it), failing t if it cannot be built: for a
// second storage on a test's database, or one on a pool the test shaped.
func OpenStorage(t testing.TB, pool *sql.DB, opts ...stepmysql.Option) *stepmysql.Storage {
	t.Helper()
	s, err := stepmysql.New(append([]stepmysql.Option{stepmysql.WithDB(pool)}, opts...)...)
	if err != nil {
		t.Fatalf("building the storage: %v", err)
	}
	return s
}

// DropReleases loses every hand-off, leaving unreferenced steps behind, as
// a process killed between a commit and its enqueue would: only a sweep
// finds them.
type DropReleases struct{}

// StepsReleased implements storage.ReleaseSink and does nothing.
func (DropReleases) StepsReleased(context.Context, []storage.ReleasedStep) error { return nil }
