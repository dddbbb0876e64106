package mysql_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
)

func TestStoreStepConflictNamesTheEnrollmentAndCommandAndWritesNothing(t *testing.T) {
	t.Parallel()
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

// Ids or UUIDs of one step that differ only in case are different bytes
// (validateStep lets them by) but one row to the database under NanoCMD's
// schema's collation: the step is refused as repeating itself, naming
// both, not as a conflict with some unnamed enrollment.
func TestStoreStepNamesIdsTheDatabaseTakesForOne(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	before := countRows(t, b.db.DB)
	for _, tc := range []struct {
		name   string
		mutate func(*nanostorage.StepEnqueuingWithConfig)
		want   string
	}{
		{"ids", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs[2] = strings.ToLower(s.IDs[0]) },
			`ids[2]: "case-id-00000" repeats ids[0] ("case-ID-00000") to the database, which compares ids without regard to case or trailing spaces`},
		{"uuids", func(s *nanostorage.StepEnqueuingWithConfig) {
			s.Commands[1].CommandUUID = strings.ToUpper(s.Commands[0].CommandUUID)
		},
			`commands[1].command_uuid: "CASE-UUID-00000" repeats commands[0] ("case-UUID-00000") to the database, which compares UUIDs without regard to case or trailing spaces`},
	} {
		step := testkit.FanOut("case", 3, 2)
		tc.mutate(step)
		_, err := b.store.StoreStepID(t.Context(), step, time.Now())
		if storage.ErrorCode(err) != storage.EInvalid || err.Error() != tc.want {
			t.Errorf("%s: error %v (code %q), want invalid: %q", tc.name, err, storage.ErrorCode(err), tc.want)
		}
	}
	if after := countRows(t, b.db.DB); after != before {
		t.Errorf("rows after the refused steps: %+v, want unchanged %+v", after, before)
	}
}

// The engine takes the running ids out of the ones it starts by exact
// comparison, so the running ones are named as it asked for them: an
// exclusive workflow running for "case-ID-00000" is running for
// "CASE-ID-00000" too, the same row to the database.
func TestOutstandingWorkflowStatusNamesIdsAsAsked(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	step := b.stored(t, "case", 2, 1)
	upper := strings.ToUpper(step.IDs[0])
	for _, tc := range []struct{ asked, want []string }{
		{[]string{step.IDs[0], "other"}, []string{step.IDs[0]}},
		{[]string{upper, "other"}, []string{upper}},
		{[]string{upper, step.IDs[0], step.IDs[1]}, []string{upper, step.IDs[0], step.IDs[1]}},
	} {
		got, err := b.store.RetrieveOutstandingWorkflowStatus(t.Context(), step.WorkflowName, tc.asked)
		slices.Sort(got)
		slices.Sort(tc.want)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("asked %q: %q, %v; want %q", tc.asked, got, err, tc.want)
		}
	}
}

func TestStoreStepRejectsBadInputNamingTheField(t *testing.T) {
	t.Parallel()
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
		{"blank id", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs[1] = "   " }, `ids[1]: "   " begins or ends with white space`},
		// MariaDB compares "bad-ID-00000 " equal to "bad-ID-00000"
		{"id with a trailing space", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs[1] = s.IDs[0] + " " }, `ids[1]: "bad-ID-00000 " begins or ends with white space`},
		{"blank uuid", func(s *nanostorage.StepEnqueuingWithConfig) { s.Commands[1].CommandUUID = " " }, `commands[1].command_uuid: " " begins or ends with white space`},
		{"id with a control character", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs[2] = "A\x00B" }, `ids[2]: "A\x00B" holds a control character`},
		{"id with DEL", func(s *nanostorage.StepEnqueuingWithConfig) { s.IDs[0] = "A\x7f" }, `ids[0]: "A\x7f" holds a control character`},
		{"uuid with a newline", func(s *nanostorage.StepEnqueuingWithConfig) { s.Commands[0].CommandUUID = "U\nV" }, `commands[0].command_uuid: "U\nV" holds a control character`},
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
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows written by rejected steps: %+v", c)
	}
}

// "Unreferenced is terminal" holds only while id_commands rows are inserted
// in exactly one place, right after creating their own new steps row. This
// reads the package's source to keep it that way.
func TestIDCommandsAreInsertedOnlyWithTheirOwnNewStep(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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

// Times outside what the TIMESTAMP columns hold are the caller's mistake,
// named as such (a 400), never a storage failure to retry (a 503).
func TestStoreStepRefusesUnstorableTimesNamingTheField(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	for _, tc := range []struct {
		field string
		set   func(*time.Time, *time.Time)
	}{
		{"timeout", func(_, to *time.Time) { *to = time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"not_until", func(nu, _ *time.Time) { *nu = time.Date(1960, 1, 1, 0, 0, 0, 0, time.UTC) }},
		{"timeout", func(_, to *time.Time) { *to = time.Date(1969, 12, 31, 0, 0, 0, 0, time.UTC) }},
	} {
		step := testkit.FanOut("times", 1, 1)
		tc.set(&step.NotUntil, &step.Timeout)
		_, err := b.store.StoreStepID(ctx, step, time.Now())
		if storage.ErrorCode(err) != storage.EInvalid || !strings.HasPrefix(err.Error(), tc.field+": ") {
			t.Errorf("%s out of range: %v, want an invalid-input error naming %s", tc.field, err, tc.field)
		}
	}
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows written: %+v", c)
	}
}

func TestStepStatusCountsOutstandingEnrollmentsUntilCollected(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := testkit.FanOut("status", 3, 2)
	id, err := b.store.StoreStepID(ctx, step, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	st, err := b.store.StepStatus(ctx, id)
	if err != nil || st.OutstandingIDs != 3 || st.WorkflowName != step.WorkflowName || st.StepName != "step" || st.CreatedAt == nil || st.CreatedAt.IsZero() {
		t.Fatalf("status %+v, %v", st, err)
	}
	for _, c := range step.Commands {
		b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], testkit.CommandResult(c.CommandUUID))
	}
	if st, _ := b.store.StepStatus(ctx, id); st.OutstandingIDs != 2 {
		t.Errorf("outstanding %d after one enrollment finished, want 2", st.OutstandingIDs)
	}
	for _, e := range step.IDs[1:] {
		b.store.CancelSteps(ctx, e, "")
	}
	if _, err := b.store.StepStatus(ctx, id); storage.ErrorCode(err) != storage.ENotFound {
		t.Errorf("after collection: %v, want not found", err)
	}
}

// An enrollment's rows of a step go together: every DELETE FROM
// id_commands takes all of an enrollment's rows of a step (or of several
// steps, or several enrollments' of one), never some of them, so that a
// prediction of all of an enrollment's rows of a step (onetrip.go) can
// miss none. The predicted delete names every row by its full key; its
// guard checks it took them all. This reads the package's SQL to keep it
// so.
func TestIDCommandsRowsOfAStepAreDeletedTogether(t *testing.T) {
	t.Parallel()
	whole := map[string]bool{
		"enrollment_id = ? AND step_id = ?":    true,
		"enrollment_id = ? AND step_id IN (?)": true,
		"enrollment_id IN (?) AND step_id = ?": true,
		"":                                     true, // qDeletePredicted: its branches follow, checked below
	}
	src := mysqlQueriesSource(t)
	re := regexp.MustCompile("(?is)DELETE FROM id_commands WHERE\\s*([^`\"]*)")
	found := 0
	for _, m := range re.FindAllStringSubmatch(src, -1) {
		found++
		if where := strings.Join(strings.Fields(m[1]), " "); !whole[where] {
			t.Errorf("DELETE FROM id_commands WHERE %s: takes some of an enrollment's rows of a step?", where)
		}
	}
	if found == 0 {
		t.Fatal("no DELETE FROM id_commands found: the source reader is broken")
	}
	for _, branch := range []string{"qDeletePredictedOutstanding", "qDeletePredictedStored"} {
		if q := queryConst(t, branch); !strings.HasPrefix(q, "(enrollment_id = ? AND command_uuid = ? AND step_id = ? AND ") {
			t.Errorf("%s = %q: does not name its row by its full key and step", branch, q)
		}
	}
}

// queryConst is the value of the string constant name in queries.go.
func queryConst(t *testing.T, name string) string {
	t.Helper()
	af, err := parser.ParseFile(token.NewFileSet(), "queries.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range af.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if n.Name != name || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					t.Fatalf("%s is not a literal", name)
				}
				v, err := strconv.Unquote(lit.Value)
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
	}
	t.Fatalf("no constant %s in queries.go", name)
	return ""
}
