package mysql_test

import (
	"bytes"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// serverMaxPacket is the server's max_allowed_packet as a session sees it.
func serverMaxPacket(t *testing.T, db *sql.DB) int {
	t.Helper()
	return testkit.Count(t, db, `SELECT @@max_allowed_packet`)
}

// bigCommands is how many commands (or results) of how many bytes the
// server's packet takes raw but not as one event's base64: two of 7 MiB
// for 16 MiB, each under the 16 MiB column whatever the packet.
func bigCommands(t *testing.T, db *sql.DB) (n, size int) {
	t.Helper()
	packet := serverMaxPacket(t, db)
	size = min(packet*7/16, 7*mib)
	return packet/(size/3*4) + 1, size
}

// requireTooLarge fails t unless err is a storage.ETooLarge naming the
// limit the storage derived from max_allowed_packet.
func requireTooLarge(t *testing.T, err error, store *mysql.Storage) {
	t.Helper()
	t.Logf("refused: %v", err)
	if storage.ErrorCode(err) != storage.ETooLarge {
		t.Fatalf("got %v (code %q), want a too_large error (413)", err, storage.ErrorCode(err))
	}
	msg := err.Error()
	for _, want := range []string{"max_allowed_packet", strconv.Itoa(store.MaxPacket())} {
		if !strings.Contains(msg, want) {
			t.Errorf("the refusal %q does not name %q", msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("the refusal is not one line: %q", msg)
	}
}

func outboxCount(t *testing.T, b *bundle, typ string) int {
	t.Helper()
	return testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE event_type = ?`, typ)
}

// The step.completed a result would make, with the results stored before
// it, is sized before anything is written: the result that would push it
// over the limit is refused (413) and leaves every row as it was; a
// smaller one then completes the step and its event is written.
func TestAResultWhoseEventWouldNotFitIsRefusedBeforeAnythingIsCommitted(t *testing.T) {
	t.Parallel()
	const packet = 1 << 20
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox(), mysql.WithMaxPacket(packet)}})
	ctx := t.Context()
	step := b.stored(t, "fit", 1, 2)
	id, c0, c1 := step.IDs[0], step.Commands[0].CommandUUID, step.Commands[1].CommandUUID

	if _, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, bigResult(c0, 400<<10)); err != nil {
		t.Fatalf("first result (400 KiB, its event fits): %v", err)
	}
	// 400 + 400 KiB is 1.07 MiB of base64: the event would not fit.
	_, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, bigResult(c1, 400<<10))
	requireTooLarge(t, err, b.store)
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE enrollment_id = ? AND completed`, id); n != 1 {
		t.Errorf("after the refusal %d of the enrollment's commands are completed, want 1 (nothing written)", n)
	}
	if n := outboxCount(t, b, events.StepCompleted); n != 0 {
		t.Errorf("%d events written by a refused result", n)
	}

	// A result the statement alone cannot carry is refused too.
	_, err = b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, bigResult(c1, packet))
	requireTooLarge(t, err, b.store)

	r, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, bigResult(c1, 200<<10))
	if err != nil || r == nil {
		t.Fatalf("a result whose event fits: %v, %v", r, err)
	}
	if n := outboxCount(t, b, events.StepCompleted); n != 1 {
		t.Errorf("%d step.completed events, want 1", n)
	}
}

// Against the server's own max_allowed_packet, read at New: a 13 MiB
// result (17.3 MiB of base64) is refused with a 413 naming the limit before
// anything is written, and an 11 MiB one is accepted with its event
// written, whole.
func TestAThirteenMiBResultIsRefusedAndAnElevenMiBOneBecomesItsEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	ctx := t.Context()
	if got, want := b.store.MaxPacket(), serverMaxPacket(t, b.db.DB); got != want {
		t.Fatalf("the storage sizes against %d bytes, the server's max_allowed_packet is %d", got, want)
	}
	if b.store.MaxPacket() != 16<<20 {
		t.Skipf("the server's max_allowed_packet is %d, this test's sizes are for 16 MiB", b.store.MaxPacket())
	}
	step := b.stored(t, "thirteen", 2, 1)
	uuid := step.Commands[0].CommandUUID

	_, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[0], bigResult(uuid, 13*mib))
	requireTooLarge(t, err, b.store)
	if n := b.enrollmentRows(t, step.IDs[0]); n != 1 {
		t.Errorf("the refused result's enrollment holds %d rows, want its 1 (nothing written)", n)
	}

	eleven := bigResult(uuid, 11*mib)
	if r, err := b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[1], eleven); err != nil || r == nil {
		t.Fatalf("an 11 MiB result: %v, %v", r, err)
	}
	evs, err := b.store.ClaimDueEvents(ctx, 10, time.Minute)
	if err != nil || len(evs) != 1 {
		t.Fatalf("claiming the 11 MiB result's event: %d events, %v", len(evs), err)
	}
	var ev events.Event
	if err := json.Unmarshal(evs[0].Payload, &ev); err != nil {
		t.Fatal(err)
	}
	if len(ev.Step.Commands) != 1 || !bytes.Equal(ev.Step.Commands[0].Result, eleven.ResultReport) {
		t.Errorf("the event does not carry the 11 MiB result whole")
	}
}

// A NotUntil step whose step.due could not be written is refused at
// enqueue (413 naming the limit), and nothing is stored.
func TestAStepWhoseDueEventWouldNotFitIsRefusedAtEnqueue(t *testing.T) {
	t.Parallel()
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox()}})
	cmds, size := bigCommands(t, b.db.DB)
	step := testkit.FanOut("due-big", 2, cmds)
	step.NotUntil = time.Now().Add(-time.Minute)
	for i := range step.Commands {
		step.Commands[i].Command = bytes.Repeat([]byte("c"), size)
	}
	_, err := b.store.StoreStepID(t.Context(), step, time.Now())
	requireTooLarge(t, err, b.store)
	if c := countRows(t, b.db.DB); c != (testkit.StepRows{}) {
		t.Errorf("rows after the refusal: %+v, want none", c)
	}

	// The same step sent at once (no step.due) fits.
	step.NotUntil = time.Time{}
	if _, err := b.store.StoreStepID(t.Context(), step, time.Now()); err != nil {
		t.Errorf("the step without not_until: %v", err)
	}
}

// logBuffer collects a storage's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// scheduled is a storage on b's database sized for four times the server's
// packet, to store what today's server could not deliver, as a storage
// started before max_allowed_packet was lowered would have.
func scheduled(t *testing.T, b *bundle) *mysql.Storage {
	t.Helper()
	return testkit.OpenStorage(t, b.db.DB, mysql.WithOutbox(), mysql.WithMaxPacket(4*serverMaxPacket(t, b.db.DB)))
}

func requireSetAside(t *testing.T, b *bundle, logs *logBuffer, stepID int64, typ string) {
	t.Helper()
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_set_aside WHERE step_id = ? AND event_type = ? AND reason LIKE '%max_allowed_packet%'`, stepID, typ); n != 1 {
		t.Errorf("step %d: %d set-aside rows for %s naming max_allowed_packet, want 1", stepID, n, typ)
	}
	if n := b.obs.setAsideCount(typ); n != 1 {
		t.Errorf("%d %s events counted set aside, want 1", n, typ)
	}
	// every replica exports the rows left, for the dashboard
	rows := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_set_aside`)
	if g, err := b.store.Gauges(t.Context()); err != nil || g.SetAside != rows || rows < 1 {
		t.Errorf("gauges: set aside %d (%v), want the %d rows of stepcollect_set_aside", g.SetAside, err, rows)
	}
	want := fmt.Sprintf(`"step_id":%d`, stepID)
	found := false
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, `"level":"error"`) && strings.Contains(l, want) && strings.Contains(l, "set aside") {
			found = true
		}
	}
	if !found {
		t.Errorf("no ERROR log line with %s saying it was set aside in:\n%s", want, logs.String())
	}
}

// A due step whose step.due the server cannot take (bigCommands: two 7 MiB
// commands over a 16 MiB packet) is set aside, and the small due step behind it is
// sent: its step.due is in the outbox. Run again, nothing fails.
func TestATooLargeDueStepIsSetAsideAndTheStepBehindItIsSent(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox(), mysql.WithLogger(zerolog.New(logs))}})
	ctx := t.Context()
	cmds, size := bigCommands(t, b.db.DB)
	bigStep := testkit.FanOut("due-aside", 1, cmds)
	bigStep.NotUntil = time.Now().Add(-2 * time.Minute)
	for i := range bigStep.Commands {
		bigStep.Commands[i].Command = bytes.Repeat([]byte("c"), size)
	}
	bigID, err := scheduled(t, b).StoreStepID(ctx, bigStep, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	small := testkit.FanOut("due-small", 1, 1)
	small.NotUntil = time.Now().Add(-time.Minute)
	smallID, err := b.store.StoreStepID(ctx, small, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	n, err := b.store.SendDueSteps(ctx, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("SendDueSteps: %d sent, %v; want the small step sent", n, err)
	}
	if got := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE event_type = ? AND step_id = ?`, events.StepDue, smallID); got != 1 {
		t.Errorf("the small step's step.due: %d in the outbox, want 1", got)
	}
	requireSetAside(t, b, logs, bigID, events.StepDue)
	if got := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps WHERE id = ? AND not_until IS NULL`, bigID); got != 1 {
		t.Errorf("the set-aside step still has its not_until: the claim would meet it again")
	}
	if n, err := b.store.SendDueSteps(ctx, time.Now()); err != nil || n != 0 {
		t.Errorf("the next run: %d sent, %v; want nothing, no error", n, err)
	}
}

// The same for timeouts: a timed-out step whose enrollment's step.timed_out
// (bigCommands' results, as they stood) the server cannot take is set aside,
// and the small timed-out step behind it is reported.
func TestATooLargeTimedOutStepIsSetAsideAndTheStepBehindItTimesOut(t *testing.T) {
	t.Parallel()
	logs := &logBuffer{}
	b := setup(t, &setupOpts{extra: []mysql.Option{mysql.WithOutbox(), mysql.WithLogger(zerolog.New(logs))}})
	ctx := t.Context()
	big := scheduled(t, b)
	cmds, size := bigCommands(t, b.db.DB)
	bigStep := testkit.FanOut("to-aside", 1, cmds+1) // one left unanswered
	bigStep.Timeout = time.Now().Add(-2 * time.Minute)
	bigID, err := big.StoreStepID(ctx, bigStep, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for c := range cmds {
		if _, err := big.StoreCommandResponseAndRetrieveCompletedStep(ctx, bigStep.IDs[0], bigResult(bigStep.Commands[c].CommandUUID, size)); err != nil {
			t.Fatal(err)
		}
	}
	small := testkit.FanOut("to-small", 1, 1)
	small.Timeout = time.Now().Add(-time.Minute)
	smallID, err := b.store.StoreStepID(ctx, small, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	n, err := b.store.TimeOutSteps(ctx, time.Now())
	if err != nil || n != 1 {
		t.Fatalf("TimeOutSteps: %d timed out, %v; want the small step's enrollment", n, err)
	}
	if got := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM stepcollect_outbox WHERE event_type = ? AND step_id = ?`, events.StepTimedOut, smallID); got != 1 {
		t.Errorf("the small step's step.timed_out: %d in the outbox, want 1", got)
	}
	requireSetAside(t, b, logs, bigID, events.StepTimedOut)
	if got := b.enrollmentRows(t, bigStep.IDs[0]); got != cmds+1 {
		t.Errorf("the set-aside step's enrollment holds %d rows, want its %d (nothing deleted)", got, cmds+1)
	}
	if n, err := b.store.TimeOutSteps(ctx, time.Now()); err != nil || n != 0 {
		t.Errorf("the next run: %d timed out, %v; want nothing, no error", n, err)
	}
}
