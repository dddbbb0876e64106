package main_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/scrape"
)

// With a short -step-timeout and -repush-interval, NanoCMD's engine worker
// re-pushes an unanswered Mac at that interval and then times its step
// out: the step is gone, the pushes stop, and the answer that comes after
// completes nothing.
func TestAnUnansweredStepIsRePushedThenTimesOut(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	c := startCluster(t, db, 1, "-worker-interval", "1", "-repush-interval", "1", "-step-timeout", "4")
	m := newMac("TIMEOUT-A")
	c.start(t, wfLock, "", m)
	testkit.WaitUntil(t, 15*time.Second, "two re-pushes", func() (bool, any) {
		n := c.mdm.pushed(m.id)
		return n >= 2, n
	})
	c.noStepRowsLeft(t)
	// the engine worker logs the timeout after the storage deleted the
	// rows: the line may reach the process's output a moment later
	testkit.WaitUntil(t, 5*time.Second, "the step timeout logged", func() (bool, any) {
		logs := c.logs()
		return strings.Contains(logs, "step timeout"), logs
	})
	pushes := c.mdm.pushed(m.id)
	time.Sleep(2500 * time.Millisecond)
	if n := c.mdm.pushed(m.id); n != pushes {
		t.Errorf("%d more pushes after the step timed out", n-pushes)
	}
	drain(t, c.sender(), c.mdm, m)
	if inv := c.inventory(t, m.id); inv[wfLock+".received"] != nil {
		t.Errorf("a timed-out lock was completed: %v", inv)
	}
	c.noCommandEnqueuedTwice(t)
}

// A step left uncollected (as after a crash between a completion's commit
// and its collection: a steps row nothing references) is collected by the
// periodic sweep, -sweep-interval seconds apart, and the sweeps show in
// stepcollect_sweeps_total (they once did not: the counter stayed at 0).
func TestTheSweepCollectsAStepLeftBehind(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db, "-sweep-interval", "1")
	if _, err := db.DB.ExecContext(t.Context(), `INSERT INTO steps (workflow_name, instance_id) VALUES ('io.micromdm.wf.inventory.v1', 'left-behind')`); err != nil {
		t.Fatal(err)
	}
	testkit.WaitUntil(t, 15*time.Second, "the step left behind collected", func() (bool, any) {
		n := testkit.Count(t, db.DB, `SELECT COUNT(*) FROM steps`)
		return n == 0, n
	})
	testkit.WaitUntil(t, 15*time.Second, "a periodic sweep counted (sweeps_total, or the scrape's error)", func() (bool, any) {
		fams, err := scrape.Families(s.base + "/metrics")
		if err != nil {
			return false, err
		}
		n := scrape.Value(fams, "stepcollect_sweeps_total", "outcome", "ok", "trigger", "periodic")
		return n >= 1, n
	})
}
