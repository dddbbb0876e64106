package mysql_test

import (
	"bytes"
	"database/sql"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// binaryPlist is the start of a binary plist as a device may send it: not
// UTF-8 (0xD3 0x01 is the sequence MariaDB quoted refusing one), with a NUL.
func binaryPlist(tag string) []byte {
	return append([]byte("bplist00\xd3\x01\x02\x03\x00\xff\xfe"), tag...)
}

// A command's result, a raw command and a step's context are bytes, and
// come back as sent whichever way the result is committed: predicted (a
// routine, this process stored the step), by the query (another process),
// and on a pool the storage did not open (database/sql's transaction).
// Before migration 14 a binary plist result of a step with another command
// outstanding was refused with a 400, and NanoMDM never sends it again.
func TestBinaryResultsCommandsAndContextAreStoredAsSent(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		plain bool
	}{{"own pool", false}, {"plain pool", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			db := testkit.NewDB(t, &testkit.DBOptions{PlainPool: tc.plain})
			var extra []mysql.Option
			if tc.plain {
				extra = append(extra, mysql.WithIsolation(sql.LevelReadCommitted))
			}
			b := setup(t, &setupOpts{db: db, extra: extra})
			other := testkit.OpenStorage(t, db.DB, extra...) // knows nothing of the step

			step := testkit.FanOut("bin", 2, 2)
			step.Context = binaryPlist("context")
			if err := b.store.StoreStep(ctx, step, time.Now()); err != nil {
				t.Fatalf("storing a step with a binary context: %v", err)
			}
			for i, store := range []*mysql.Storage{b.store, other} {
				id := step.IDs[i]
				first := binaryPlist(id + "-first")
				res, err := store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id,
					&nanostorage.StepCommandResult{CommandUUID: step.Commands[0].CommandUUID, Completed: true, ResultReport: first})
				if err != nil || res != nil {
					t.Fatalf("%s: a binary result with another command outstanding: %v, %+v", id, err, res)
				}
				second := binaryPlist(id + "-second")
				res, err = store.StoreCommandResponseAndRetrieveCompletedStep(ctx, id,
					&nanostorage.StepCommandResult{CommandUUID: step.Commands[1].CommandUUID, Completed: true, ResultReport: second})
				if err != nil || res == nil {
					t.Fatalf("%s: the completing binary result: %v, %+v", id, err, res)
				}
				if !bytes.Equal(res.Context, step.Context) {
					t.Errorf("%s: context %q, want %q", id, res.Context, step.Context)
				}
				got := map[string][]byte{}
				for _, c := range res.Commands {
					got[c.CommandUUID] = c.ResultReport
				}
				if !bytes.Equal(got[step.Commands[0].CommandUUID], first) || !bytes.Equal(got[step.Commands[1].CommandUUID], second) {
					t.Errorf("%s: results %q, want %q and %q", id, got, first, second)
				}
			}

			// a NotUntil step keeps its raw commands until they are sent
			later := testkit.FanOut("binlater", 2, 1)
			later.Context = binaryPlist("later-context")
			later.Commands[0].Command = binaryPlist("command")
			later.NotUntil = time.Now().Add(-time.Minute)
			if err := b.store.StoreStep(ctx, later, time.Now()); err != nil {
				t.Fatalf("storing a NotUntil step with a binary command: %v", err)
			}
			due, err := b.store.RetrieveStepsToEnqueue(ctx, time.Now())
			if err != nil || len(due) != 1 || len(due[0].Commands) != 1 {
				t.Fatalf("due steps: %v, %+v", err, due)
			}
			if !bytes.Equal(due[0].Commands[0].Command, later.Commands[0].Command) {
				t.Errorf("due step: command %q, want %q", due[0].Commands[0].Command, later.Commands[0].Command)
			}
			// (a due step carries no context, as NanoCMD's does not: read the row)
			var stored []byte
			if err := db.DB.QueryRowContext(ctx, `SELECT context FROM steps WHERE workflow_name = ?`, later.WorkflowName).Scan(&stored); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(stored, later.Context) {
				t.Errorf("stored context %q, want %q", stored, later.Context)
			}
		})
	}
}
