package mysql_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

func TestListStepsOldestFirstPagedFilteredWithCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	a := b.stored(t, "lista", 3, 2)
	b.stored(t, "listb", 2, 1)
	c := b.stored(t, "listc", 4, 1)
	// one of a's enrollments finishes: ids stays 3, outstanding goes to 2
	for cmd := range 2 {
		if _, err := b.answer(ctx, a, 0, cmd); err != nil {
			t.Fatal(err)
		}
	}

	var all []storage.StepSummary
	f := storage.StepFilter{Limit: 2}
	for pages := 0; ; pages++ {
		got, more, err := b.store.ListSteps(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, got...)
		if !more {
			if pages != 1 {
				t.Errorf("3 steps at 2 a page: %d pages, want 2", pages+1)
			}
			break
		}
		last := got[len(got)-1]
		f.After = &storage.StepCursor{CreatedAt: last.CreatedAt, ID: last.StepID}
	}
	if len(all) != 3 {
		t.Fatalf("listed %d steps, want 3: %+v", len(all), all)
	}
	for i, want := range []struct {
		wf               string
		ids, outstanding int
	}{{a.WorkflowName, 3, 2}, {"io.stepcollect.test.listb", 2, 2}, {c.WorkflowName, 4, 4}} {
		st := all[i]
		if st.WorkflowName != want.wf || st.IDs == nil || *st.IDs != want.ids || st.OutstandingIDs != want.outstanding {
			t.Errorf("step %d: %s ids=%v outstanding=%d, want %s ids=%d outstanding=%d", i, st.WorkflowName, st.IDs, st.OutstandingIDs, want.wf, want.ids, want.outstanding)
		}
		if i > 0 && all[i-1].StepID >= st.StepID {
			t.Errorf("not oldest first: %d before %d", all[i-1].StepID, st.StepID)
		}
	}

	for name, f := range map[string]storage.StepFilter{
		"workflow": {WorkflowName: c.WorkflowName, Limit: 10},
		"instance": {InstanceID: c.InstanceID, Limit: 10},
		"both":     {WorkflowName: c.WorkflowName, InstanceID: c.InstanceID, Limit: 10},
	} {
		got, more, err := b.store.ListSteps(ctx, f)
		if err != nil || more || len(got) != 1 || got[0].StepID != all[2].StepID {
			t.Errorf("%s: %+v more=%v err=%v, want step %d alone", name, got, more, err, all[2].StepID)
		}
	}
	got, _, err := b.store.ListSteps(ctx, storage.StepFilter{OlderThan: time.Hour, Limit: 10})
	if err != nil || len(got) != 0 {
		t.Errorf("older than 1h: %+v %v, want none", got, err)
	}
	// created_at has whole seconds: within two, every step is older than 1µs
	testkit.WaitUntil(t, 15*time.Second, "every step older than 1µs", func() (bool, any) {
		got, _, err = b.store.ListSteps(ctx, storage.StepFilter{OlderThan: time.Microsecond, Limit: 10})
		return err == nil && len(got) == 3, fmt.Sprint(len(got), err)
	})
	for _, limit := range []int{0, -1, mysql.MaxPage + 1} {
		if _, _, err := b.store.ListSteps(ctx, storage.StepFilter{Limit: limit}); storage.ErrorCode(err) != storage.EInvalid {
			t.Errorf("limit %d: %v, want EInvalid", limit, err)
		}
	}
}

// The list and its counts are read through indexes, whichever filter is
// given (MariaDB's and MySQL's EXPLAIN both say type ALL for a full scan),
// and a cancel's delete of 100 enrollments goes by PRIMARY.
func TestOperatorQueriesReadThroughIndexes(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	for i := range 30 {
		b.stored(t, fmt.Sprintf("explain%02d", i), 20, 2)
	}
	// enough steps that a scan costs more than an index, as in production
	for _, st := range testkit.StepEach("explainmany", 300) {
		if err := b.store.StoreStep(ctx, st, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.db.ExecContext(ctx, "ANALYZE TABLE steps, id_commands"); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 100 {
		ids = append(ids, fmt.Sprintf("'%s'", testkit.EnrollmentID(fmt.Sprintf("explain%02d", i%30), i%20)))
	}
	hundredIDs := strings.Join(ids, ", ")
	after := time.Now().Add(-time.Hour).UTC().Format("2006-01-02 15:04:05")
	for name, q := range map[string]string{
		"all":           qList(""),
		"after":         qList(` AND (s.created_at > '` + after + `' OR (s.created_at = '` + after + `' AND s.id > 3))`),
		"workflow":      qList(` AND s.workflow_name = 'io.stepcollect.test.explain07'`),
		"instance":      qList(` AND s.instance_id = 'explain07-instance'`),
		"both":          qList(` AND s.workflow_name = 'io.stepcollect.test.explain07' AND s.instance_id = 'explain07-instance'`),
		"older_than":    qList(` AND s.created_at <= TIMESTAMPADD(MICROSECOND, -3600000000, CURRENT_TIMESTAMP)`),
		"cancel_delete": `DELETE FROM id_commands WHERE enrollment_id IN (` + hundredIDs + `) AND step_id = 8`,
		"outstanding": `SELECT DISTINCT enrollment_id FROM id_commands
WHERE step_id = 7 AND enrollment_id > '' ORDER BY enrollment_id LIMIT 11`,
		"outstanding_after": `SELECT DISTINCT enrollment_id FROM id_commands
WHERE step_id = 7 AND enrollment_id > 'explain06-ID-00005' ORDER BY enrollment_id LIMIT 11`,
	} {
		rows, err := b.db.QueryContext(ctx, "EXPLAIN "+q)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		cols, _ := rows.Columns()
		for rows.Next() {
			vals := make([]any, len(cols))
			ptrs := make([]any, len(cols))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			if err := rows.Scan(ptrs...); err != nil {
				t.Fatal(err)
			}
			row := map[string]string{}
			for i, c := range cols {
				row[c] = fmt.Sprintf("%s", vals[i])
			}
			if row["type"] == "ALL" || row["table"] == "c" && row["type"] == "index" || row["table"] == "id_commands" && (row["key"] == "PRIMARY") != strings.HasPrefix(name, "cancel") {
				t.Errorf("%s: full scan of %s: %v", name, row["table"], row)
			}
			t.Logf("%s: table=%s type=%s key=%s rows=%s extra=%s", name, row["table"], row["type"], row["key"], row["rows"], row["Extra"])
		}
		rows.Close()
	}
}

// qList is the list query as ListSteps builds it, for EXPLAIN.
func qList(where string) string {
	return `SELECT s.id, s.workflow_name, s.instance_id, s.step_name, s.created_at, s.not_until, s.timeout, s.stepcollect_ids,
  (SELECT COUNT(DISTINCT c.enrollment_id) FROM id_commands c WHERE c.step_id = s.id)
FROM steps s WHERE 1 = 1` + where + ` ORDER BY s.created_at, s.id LIMIT 11`
}

func TestStepOutstandingPagesTheEnrollmentsNotDone(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := b.stored(t, "outst", 5, 1)
	if _, err := b.answer(ctx, step, 2, 0); err != nil {
		t.Fatal(err)
	}
	id := stepIDOf(t, b, step)
	var got []string
	after := ""
	for {
		page, more, err := b.store.StepOutstanding(ctx, id, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		if !more {
			break
		}
		after = page[len(page)-1]
	}
	want := []string{step.IDs[0], step.IDs[1], step.IDs[3], step.IDs[4]}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("outstanding %v, want %v", got, want)
	}
	if _, _, err := b.store.StepOutstanding(ctx, id+1000, "", 10); !errors.Is(err, storage.ErrStepNotFound) {
		t.Errorf("unknown step: %v, want ErrStepNotFound", err)
	}
	if _, _, err := b.store.StepOutstanding(ctx, id, "", mysql.MaxPage+1); storage.ErrorCode(err) != storage.EInvalid {
		t.Errorf("limit over the page: %v, want EInvalid", err)
	}
}

func stepIDOf(t *testing.T, b *bundle, step *nanostorage.StepEnqueuingWithConfig) int64 {
	t.Helper()
	return int64(testkit.Count(t, b.db.DB, `SELECT id FROM steps WHERE workflow_name = ?`, step.WorkflowName))
}

// A step of 2,500 enrollments (three cancel transactions) is cancelled for
// every enrollment still holding it, a partly answered one included, and
// collected; no event is written; a second cancel finds nothing (404).
func TestCancelStepCancelsEveryEnrollmentInBatchesAndCollects(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := b.stored(t, "cancelbig", 2500, 2)
	other := b.stored(t, "cancelother", 3, 1)
	id := stepIDOf(t, b, step)
	if _, err := b.answer(ctx, step, 0, 0); err != nil { // one of two: still outstanding
		t.Fatal(err)
	}
	for c := range 2 { // enrollment 1 finishes
		if _, err := b.answer(ctx, step, 1, c); err != nil {
			t.Fatal(err)
		}
	}
	n, err := b.store.CancelStep(ctx, id)
	if err != nil || n != 2499 {
		t.Fatalf("cancel: %d, %v; want 2499 enrollments", n, err)
	}
	if got := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE step_id = ?`, id); got != 0 {
		t.Errorf("%d id_commands rows left", got)
	}
	if got := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps WHERE id = ?`, id); got != 0 {
		t.Errorf("step not collected")
	}
	if got := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE step_id = ?`, stepIDOf(t, b, other)); got != 3 {
		t.Errorf("the other step lost rows: %d left, want 3", got)
	}
	if _, err := b.answer(ctx, step, 5, 0); !errors.Is(err, storage.ErrUnknownCommand) {
		t.Errorf("result after the cancel: %v, want ErrUnknownCommand", err)
	}
	if _, err := b.store.CancelStep(ctx, id); !errors.Is(err, storage.ErrStepNotFound) {
		t.Errorf("second cancel: %v, want ErrStepNotFound", err)
	}
	if _, err := b.store.CancelStep(ctx, id+1000); !errors.Is(err, storage.ErrStepNotFound) {
		t.Errorf("unknown step: %v, want ErrStepNotFound", err)
	}
}

func TestCancelWorkflowInstanceCancelsItsStepsOnly(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	x := b.stored(t, "wfx", 3, 1)
	x2 := testkit.FanOut("wfx2", 2, 1)
	x2.WorkflowName, x2.InstanceID = x.WorkflowName, x.InstanceID
	if err := b.store.StoreStep(ctx, x2, time.Now()); err != nil {
		t.Fatal(err)
	}
	y := testkit.FanOut("wfy", 2, 1) // same workflow, other instance
	y.WorkflowName = x.WorkflowName
	if err := b.store.StoreStep(ctx, y, time.Now()); err != nil {
		t.Fatal(err)
	}
	n, err := b.store.CancelWorkflowInstance(ctx, x.WorkflowName, x.InstanceID)
	if err != nil || n != 2 {
		t.Fatalf("cancel instance: %d, %v; want 2 steps", n, err)
	}
	if got := testkit.CountStepRows(t, b.db.DB); got.Steps != 1 || got.IDCommands != 2 {
		t.Errorf("left %+v, want the other instance's step alone (1 step, 2 rows)", got)
	}
	if n, err := b.store.CancelWorkflowInstance(ctx, x.WorkflowName, x.InstanceID); err != nil || n != 0 {
		t.Errorf("again: %d, %v; want 0", n, err)
	}
	for _, c := range [][2]string{{"", "i"}, {"w", ""}} {
		if _, err := b.store.CancelWorkflowInstance(ctx, c[0], c[1]); storage.ErrorCode(err) != storage.EInvalid {
			t.Errorf("%q: %v, want EInvalid", c, err)
		}
	}
}
