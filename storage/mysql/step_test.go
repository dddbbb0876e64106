package mysql_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

func TestStoreStepConflictNamesTheEnrollmentAndCommandAndWritesNothing(t *testing.T) {
	b := setup(t, nil)
	ctx := t.Context()
	first := b.stored(t, "conflict", 3, 1)
	before := countRows(t, b.db.DB)

	// 2500 ids (three INSERT chunks), the last of which collides
	second := testkit.FanOut("other", 2500, 2)
	second.Commands[1].CommandUUID = first.Commands[0].CommandUUID
	second.IDs[2499] = first.IDs[1]
	second.NotUntil = time.Now().Add(time.Hour)
	_, err := b.store.StoreStepID(ctx, second, time.Now())
	if storage.ErrorCode(err) != storage.EConflict {
		t.Fatalf("error %v (code %q), want a conflict", err, storage.ErrorCode(err))
	}
	want := fmt.Sprintf("enrollment %q already holds command %q", first.IDs[1], first.Commands[0].CommandUUID)
	if err.Error() != want {
		t.Errorf("error %q, want %q", err, want)
	}
	if after := countRows(t, b.db.DB); after != before {
		t.Errorf("rows after the failed store: %+v, want unchanged %+v", after, before)
	}
}

func TestStoreStepRejectsBadInputNamingTheField(t *testing.T) {
	b := setup(t, nil)
	ctx := t.Context()
	long := strings.Repeat("x", 256)
	for _, tc := range []struct {
		name   string
		mutate func(*nanostorage.StepEnqueuingWithConfig)
		want   string
	}{
		{"no workflow", func(s *nanostorage.StepEnqueuingWithConfig) { s.WorkflowName = "" }, "workflow_name: missing"},
		{"long workflow", func(s *nanostorage.StepEnqueuingWithConfig) { s.WorkflowName = long }, "workflow_name: longer than 255 bytes"},
		{"no instance", func(s *nanostorage.StepEnqueuingWithConfig) { s.InstanceID = "" }, "instance_id: missing"},
		{"no ids", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs = nil }, "ids: empty"},
		{"empty id", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs[1] = "" }, "ids[1]: empty"},
		{"repeated id", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs[2] = s.IDs[0] }, `ids[2]: "bad-ID-00000" repeats ids[0]`},
		{"no commands", func(s *nanostorage.StepEnqueuingWithConfig) { s.Commands = nil }, "commands: empty"},
		{"no uuid", func(s *nanostorage.StepEnqueuingWithConfig) { s.Commands[1].CommandUUID = "" }, "commands[1].command_uuid: missing"},
		{"repeated uuid", func(s *nanostorage.StepEnqueuingWithConfig) { s.Commands[1].CommandUUID = s.Commands[0].CommandUUID },
			`commands[1].command_uuid: "bad-UUID-00000" repeats commands[0]`},
		{"no request type", func(s *nanostorage.StepEnqueuingWithConfig) { s.Commands[0].RequestType = "" }, "commands[0].request_type: missing"},
		{"not_until without raw command", func(s *nanostorage.StepEnqueuingWithConfig) {
			s.NotUntil = time.Now().Add(time.Hour)
			s.Commands[1].Command = nil
		}, "commands[1].command: missing (a not_until step keeps its raw commands to send later)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			step := testkit.FanOut("bad", 3, 2)
			tc.mutate(step)
			err := b.store.StoreStep(ctx, step, time.Now())
			if storage.ErrorCode(err) != storage.EInvalid || err.Error() != tc.want {
				t.Errorf("error %v (code %q), want invalid: %q", err, storage.ErrorCode(err), tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is not one line: %q", err)
			}
		})
	}
	if c := countRows(t, b.db.DB); c != (rowCounts{}) {
		t.Errorf("rows written by rejected steps: %+v", c)
	}
}

// "Unreferenced is terminal" holds only while id_commands rows are inserted
// in exactly one place, right after creating their own new steps row. This
// reads the package's source to keep it that way.
func TestIDCommandsAreInsertedOnlyWithTheirOwnNewStep(t *testing.T) {
	fset := token.NewFileSet()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var users []string
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok {
				continue
			}
			uses := map[string]int{}
			ast.Inspect(fn, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok {
					uses[id.Name]++
				}
				return true
			})
			if uses["qCreateIDCommands"] > 0 {
				users = append(users, fn.Name.Name)
				if uses["qCreateStep"] == 0 {
					t.Errorf("%s inserts id_commands without creating their step", fn.Name.Name)
				}
			}
		}
	}
	if len(users) != 1 || users[0] != "StoreStepID" {
		t.Errorf("id_commands inserted by %v, want by StoreStepID alone", users)
	}
	// and in the SQL itself: one INSERT INTO id_commands
	if n := strings.Count(strings.ToUpper(mysqlQueriesSource(t)), "INSERT INTO ID_COMMANDS"); n != 1 {
		t.Errorf("%d INSERT INTO id_commands statements, want 1", n)
	}
}

// mysqlQueriesSource is every string literal of the package's non-test
// files: its SQL, without the comments that talk about it.
func mysqlQueriesSource(t *testing.T) string {
	var all strings.Builder
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(af, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				all.WriteString(lit.Value + "\n")
			}
			return true
		})
	}
	return all.String()
}

// Behaviourally: storing the same enrollments and UUIDs again after a step
// was collected makes a new step; it never revives the old one.
func TestStoringAgainAfterCollectionMakesANewStep(t *testing.T) {
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("again", 2, 1)
	first, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range step.IDs {
		if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, testkit.CommandResult(step.Commands[0].CommandUUID)); err != nil {
			t.Fatal(err)
		}
	}
	second, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if second == first {
		t.Fatalf("step id %d reused", first)
	}
	n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE step_id = ?`, first)
	if n != 0 {
		t.Errorf("the collected step %d gained %d references", first, n)
	}
}

func TestMigrateFromManyProcessesAtOnceAppliesOnce(t *testing.T) {
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

// OpenDB's sessions run at READ COMMITTED without a per-transaction SET.
func TestOpenDBSessionsAreReadCommitted(t *testing.T) {
	tdb := testkit.NewDB(t, nil)
	db, err := mysql.OpenDB(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var level string
	if err := db.QueryRow(`SELECT @@SESSION.tx_isolation`).Scan(&level); err != nil {
		// MySQL 8 knows it only as transaction_isolation
		if err := db.QueryRow(`SELECT @@SESSION.transaction_isolation`).Scan(&level); err != nil {
			t.Fatal(err)
		}
	}
	if level != "READ-COMMITTED" {
		t.Errorf("session isolation %s, want READ-COMMITTED", level)
	}
}

// OpenDB's pool keeps its connections between bursts: database/sql's own
// default keeps 2 idle, so every burst of concurrent results opened (and
// then closed) a connection for each result but two.
func TestOpenDBKeepsItsConnectionsBetweenBursts(t *testing.T) {
	tdb := testkit.NewDB(t, nil)
	db, err := mysql.OpenDB(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	burst := func() {
		var wg sync.WaitGroup
		for range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := db.Exec(`DO SLEEP(0.05)`); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	burst()
	burst()
	if st := db.Stats(); st.MaxIdleClosed != 0 || st.MaxOpenConnections != mysql.DefaultPoolSize {
		t.Errorf("after two bursts of 40: %d connections closed for want of idle room, %d open at most; want 0 and %d", st.MaxIdleClosed, st.MaxOpenConnections, mysql.DefaultPoolSize)
	}
}
