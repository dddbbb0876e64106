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

// On a database whose default character set is not utf8mb4 (an older
// server's or database's), every table is utf8mb4: an enrollment id with an
// emoji is stored and completes, and the routines' parameters are in
// id_commands' character set, so completions call them.
func TestTablesAreUTF8MB4WhateverTheDatabasesDefault(t *testing.T) {
	t.Parallel()
	for _, charset := range []string{"utf8mb3", "latin1"} {
		t.Run(charset, func(t *testing.T) {
			db := testkit.NewDB(t, &testkit.DBOptions{Charset: charset})
			other := testkit.Column[string](t, db.DB, `SELECT CONCAT(TABLE_NAME, ' ', TABLE_COLLATION) FROM information_schema.TABLES
				WHERE TABLE_SCHEMA = DATABASE() AND TABLE_COLLATION NOT LIKE 'utf8mb4%' AND TABLE_NAME <> ?`, mysql.MigrationsTable)
			if len(other) > 0 {
				t.Errorf("tables not in utf8mb4: %v", other)
			}
			b := setup(t, &setupOpts{db: db, extra: []mysql.Option{mysql.WithOutbox()}})
			step := b.storedOn(t, completionPaths[3], "💻-"+charset, 2, 1)
			for i := range step.IDs {
				if r, err := b.answer(t.Context(), step, i, 0); err != nil || r == nil {
					t.Fatalf("completing %s: %+v, %v", step.IDs[i], r, err)
				}
			}
			if mysql.Calls(b.store) == 0 {
				t.Error("no completion called its routine: its parameters are not in id_commands' character set")
			}
		})
	}
}
