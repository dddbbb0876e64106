package mysql_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

func TestMigrateFromManyProcessesAtOnceAppliesOnce(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	const procs = 8
	errs := make([]error, procs)
	startTogether(procs, func(i int) {
		// each "process" has its own pool, as replicas would
		own, err := mysql.OpenDB(db.DSN)
		if err != nil {
			errs[i] = err
			return
		}
		defer own.Close()
		errs[i] = mysql.Migrate(t.Context(), own)
	})
	for i, err := range errs {
		if err != nil {
			t.Errorf("process %d: %v", i, err)
		}
	}
	cur, latest, err := mysql.SchemaVersion(t.Context(), db.DB)
	if err != nil || cur != latest || latest < 1 {
		t.Fatalf("schema version %d of %d: %v", cur, latest, err)
	}
	// one row per migration file: version numbers may have gaps
	files, err := filepath.Glob("migrations/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("migration files: %v, %v", files, err)
	}
	applied := testkit.Count(t, db.DB, `SELECT COUNT(*) FROM `+mysql.MigrationsTable+` WHERE version_id > 0`)
	if applied != len(files) {
		t.Errorf("%d migrations recorded, want %d (each once)", applied, len(files))
	}
	// and again, later: nothing to do
	if err := mysql.Migrate(t.Context(), db.DB); err != nil {
		t.Fatal(err)
	}
}

// Every index is written by every row a result or a delivery touches; the
// ones no query reads are dropped. id_commands keeps its primary key (the
// result path, cancels, lookups), step_id (collection's reference check,
// and the foreign key) and last_push (the re-push claim): three of
// NanoCMD's schema went (migration 00009). The outbox keeps its primary
// key, event_id (evidence, operators) and held_at (the claim): created_at
// and lease_until went (00010).
func TestHotTablesKeepOnlyTheIndexesSomethingReads(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, nil)
	for table, want := range map[string][]string{
		"id_commands":        {"PRIMARY", "last_push", "step_id"},
		"stepcollect_outbox": {"PRIMARY", "outbox_event_id", "outbox_held_at"},
	} {
		got := testkit.Column[string](t, db.DB, `SELECT DISTINCT index_name FROM information_schema.statistics
		WHERE table_schema = DATABASE() AND table_name = ?`, table)
		slices.Sort(got) // the server's collation orders them its own way
		if !slices.Equal(got, want) {
			t.Errorf("%s indexes %v, want %v", table, got, want)
		}
	}
}

// CheckSchema names where the schema is and what the build needs: nothing
// migrated, one migration short (a process of a newer build before the
// one that migrates), and current.
func TestCheckSchemaNamesTheVersions(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	ctx := t.Context()
	_, latest, err := mysql.SchemaVersion(ctx, db.DB)
	if err != nil {
		t.Fatal(err)
	}
	if err := mysql.CheckSchema(ctx, db.DB); err == nil || !strings.HasPrefix(err.Error(), "schema: not migrated") {
		t.Errorf("unmigrated: %v", err)
	}
	if err := mysql.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	if err := mysql.CheckSchema(ctx, db.DB); err != nil {
		t.Errorf("migrated: %v", err)
	}
	if _, err := db.Exec(`DELETE FROM `+mysql.MigrationsTable+` WHERE version_id = ?`, latest); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("schema: at migration %d, this build needs %d: start one process with -migrate=true", latest-1, latest)
	if err := mysql.CheckSchema(ctx, db.DB); err == nil || err.Error() != want {
		t.Errorf("one short: %v, want %q", err, want)
	}
}
