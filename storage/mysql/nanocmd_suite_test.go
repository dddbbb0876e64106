package mysql_test

import (
	"testing"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	nanotest "github.com/micromdm/nanocmd/engine/storage/test"

	"github.com/stepcollect/stepcollect/internal/testkit"
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
