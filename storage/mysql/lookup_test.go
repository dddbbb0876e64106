package mysql_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// Many lookups at once (sharing reads) each get the answer a lookup alone
// gets: the request type of a command the enrollment holds, none for one
// it does not hold, for an enrollment that holds nothing or for a command
// of another enrollment, and for an id in other letter case whatever the
// server's collation says (the single statement's answer).
func TestConcurrentRequestTypeLookupsEachGetTheirOwnAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t, nil)
	ctx := t.Context()
	step := b.stored(t, "lookup", 40, 2)
	type ask struct {
		id, uuid string
		want     bool
	}
	var asks []ask
	for i, id := range step.IDs {
		asks = append(asks, ask{id, step.Commands[i%2].CommandUUID, true}, ask{id, "no-such-command", false},
			ask{"no-such-" + id, step.Commands[0].CommandUUID, false})
	}
	// letter case: whatever the single statement answers
	var single string
	err := b.db.DB.QueryRowContext(ctx, `SELECT COUNT(*) FROM id_commands WHERE enrollment_id = ? AND command_uuid = ?`,
		strings.ToUpper(step.IDs[0]), step.Commands[0].CommandUUID).Scan(&single)
	if err != nil {
		t.Fatal(err)
	}
	asks = append(asks, ask{strings.ToUpper(step.IDs[0]), step.Commands[0].CommandUUID, single == "1"})

	var wg sync.WaitGroup
	errs := make(chan error, 3*len(asks))
	for range 3 { // each key asked three times at once
		for _, a := range asks {
			wg.Go(func() {
				rt, ok, err := b.store.RetrieveCommandRequestType(ctx, a.id, a.uuid)
				switch {
				case err != nil:
					errs <- err
				case ok != a.want || (ok && rt != "DeviceInformation"):
					errs <- fmt.Errorf("lookup (%s, %s): %q, %v; want found %v", a.id, a.uuid, rt, ok, a.want)
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
