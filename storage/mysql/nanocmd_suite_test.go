package mysql_test

import (
	"database/sql"
	"testing"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	nanotest "github.com/micromdm/nanocmd/engine/storage/test"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// NanoCMD's own behavioural suite, on a database this package migrated.
func TestNanoCMDSuiteOnFreshDatabase(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	nanotest.TestEngineStorage(t, func() nanostorage.AllStorage { return b.store })
}

// The same suite on a database NanoCMD v0.7.1 made with its schema.sql,
// then migrated by us: adopting an existing NanoCMD database must work.
func TestNanoCMDSuiteOnNanoCMDMadeDatabase(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	loadNanoCMDSchema(t, db.DB)
	b := setup(t, &setupOpts{db: db, migrate: true})
	nanotest.TestEngineStorage(t, func() nanostorage.AllStorage { return b.store })
}

// The suite's two smaller entry points, also on their own, as NanoCMD's
// backends each run them.
func TestNanoCMDEventAndStatusSuites(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	nanotest.TestEventStorage(t, b.store)
	nanotest.TestEventStatusStorage(t, t.Context(), b.store)
}

// The suite on a pool the storage did not open, as a program embedding it
// gives through WithDB: no multiStatements, so completions take
// database/sql's transaction instead of two round trips (conntx.go).
func TestNanoCMDSuiteOnAPlainPool(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{PlainPool: true})
	b := setup(t, &setupOpts{db: db, extra: []mysql.Option{mysql.WithIsolation(sql.LevelReadCommitted)}})
	if mysql.TwoTrips(b.store) {
		t.Fatal("two round trips on a plain pool")
	}
	nanotest.TestEngineStorage(t, func() nanostorage.AllStorage { return b.store })
}
