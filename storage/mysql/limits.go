package mysql

import (
	"context"
	"database/sql"
	"fmt"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"

	"github.com/stepcollect/stepcollect/storage"
)

// Every statement the server takes, an outbox INSERT with its event above
// all, must fit the server's max_allowed_packet: over it, the server
// refuses the statement (1153) and drops the connection. So what would make
// a statement too large is refused before anything is committed, with a
// limit derived from the packet (docs/reference.md, Limits).
const (
	// The text of the largest INSERT or UPDATE around its one large value,
	// its other columns (ids, names, escaped) and the protocol's header.
	stmtOverhead = 16 << 10
	// An event's JSON around its step's fields: event id, type, time, keys.
	eventOverhead = 1 << 10
	// One command's keys and punctuation in an event, quotes escaped.
	eventCommandOverhead = 128
	// One enrollment id's quotes and comma in an event's ids.
	eventIDOverhead = 8
	// go-sql-driver's own limit on what it sends unless the DSN's
	// maxAllowedPacket says otherwise.
	driverMaxPacket = 64 << 20
)

// readMaxPacket reads the server's max_allowed_packet (the session takes
// the global value at connect and cannot change it).
func readMaxPacket(ctx context.Context, db *sql.DB) (int, error) {
	var n int64
	if err := db.QueryRowContext(ctx, `SELECT @@max_allowed_packet`).Scan(&n); err != nil {
		return 0, fmt.Errorf("mysql storage: reading max_allowed_packet: %w", err)
	}
	return int(n), nil
}

// eventLimit is the most bytes an event may take, as its INSERT sends it.
func (s *Storage) eventLimit() int { return s.maxPacket - stmtOverhead }

// tooLarge refuses field because what it makes (detail) would take n
// bytes: one line, the limit and where it comes from first, so that a
// shortened answer still names them.
func (s *Storage) tooLarge(field, detail string, n int) error {
	return &limitError{storage.Errorf(storage.ETooLarge, "%s: over the %d-byte limit derived from the server's max_allowed_packet (%d bytes): %s would take %d bytes",
		field, s.eventLimit(), s.maxPacket, detail, n)}
}

// limitError is a refusal by tooLarge. Its message already names what was
// refused, and is returned as it is, not behind the operation's prefix.
type limitError struct{ err *storage.Error }

func (e *limitError) Error() string { return e.err.Message }
func (e *limitError) Unwrap() error { return e.err }

// b64Len is the length of the standard base64 of n bytes.
func b64Len(n int) int { return (n + 2) / 3 * 4 }

// escapedLen is len(b) as an interpolated statement carries it: the driver
// backslash-escapes these bytes (or doubles quotes under
// NO_BACKSLASH_ESCAPES, which is less).
func escapedLen(b []byte) int {
	n := len(b)
	for _, c := range b {
		switch c {
		case 0, '\n', '\r', '\\', '\'', '"', 0x1a:
			n++
		}
	}
	return n
}

// escapedOver says whether b, as escapedLen counts it, takes more than
// limit bytes. Escaping at most doubles b, so a value of less than half
// the limit (every result and event under a server's usual
// max_allowed_packet) is answered from its length, without reading it:
// the scan was about 4% of the api's CPU end to end.
func escapedOver(b []byte, limit int) bool {
	if 2*len(b) <= limit {
		return false
	}
	return escapedLen(b) > limit
}

// textCost bounds what a short string takes in an event as its INSERT
// sends it: JSON-escaped (up to \u00XX for a byte), then every quote and
// backslash escaped again by the driver.
func textCost(s string) int {
	n := 4 // its two quotes, each escaped
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			n += 4
		case c < 0x20 || c >= 0x80 || c == '<' || c == '>' || c == '&' || c == '\'':
			n += 7
		default:
			n++
		}
	}
	return n
}

// eventSize adds up a bound on an event's size, part by part, without
// building it.
type eventSize int

// step adds a step's own fields: its names and its context (base64).
func (e *eventSize) step(workflow, instance, name string, contextLen int) {
	*e += eventSize(eventOverhead + textCost(workflow) + textCost(instance) + textCost(name) + b64Len(contextLen))
}

// id adds one enrollment id of the event's ids.
func (e *eventSize) id(id string) { *e += eventSize(eventIDOverhead + textCost(id)) }

// command adds one command with a result or raw command of n bytes.
func (e *eventSize) command(uuid, requestType string, n int) {
	*e += eventSize(eventCommandOverhead + textCost(uuid) + textCost(requestType) + b64Len(n))
}

// rawCommandRowCost bounds one raw command's row in its INSERT.
func rawCommandRowCost(c nanostorage.StepCommandRaw) int {
	return 64 + textCost(c.CommandUUID) + textCost(c.RequestType) + escapedLen(c.Command)
}

// checkStepSize refuses a step whose statements, or whose events, could
// not be written under the server's packet, before anything is: every
// event names the step's names and carries its context; each
// enrollment's step.completed or step.timed_out lists every command (the
// results are checked as they come); a NotUntil step's step.due carries
// every id and every raw command.
func (s *Storage) checkStepSize(step *nanostorage.StepEnqueuingWithConfig) error {
	if n := stmtOverhead + escapedLen(step.Context); n > s.maxPacket {
		return s.tooLarge("context", fmt.Sprintf("its statement (%d bytes of context)", len(step.Context)), n)
	}
	if !step.NotUntil.IsZero() {
		for i, c := range step.Commands {
			if n := stmtOverhead + rawCommandRowCost(c); n > s.maxPacket {
				return s.tooLarge(fmt.Sprintf("commands[%d].command", i), fmt.Sprintf("its statement (%d bytes of command)", len(c.Command)), n)
			}
		}
	}
	if !s.outbox {
		return nil
	}
	var base eventSize
	base.step(step.WorkflowName, step.InstanceID, step.Name, len(step.Context))
	longest := ""
	for _, id := range step.IDs {
		if len(id) > len(longest) {
			longest = id
		}
	}
	each := base
	each.id(longest)
	for _, c := range step.Commands {
		each.command(c.CommandUUID, c.RequestType, 0)
	}
	if int(each) > s.eventLimit() {
		return s.tooLarge("step", fmt.Sprintf("each enrollment's step.completed before any result (%d commands, %d bytes of context)", len(step.Commands), len(step.Context)), int(each))
	}
	if step.NotUntil.IsZero() {
		return nil
	}
	due, raw := base, 0
	for _, id := range step.IDs {
		due.id(id)
	}
	for _, c := range step.Commands {
		due.command(c.CommandUUID, c.RequestType, len(c.Command))
		raw += len(c.Command)
	}
	if int(due) > s.eventLimit() {
		return s.tooLarge("step", fmt.Sprintf("its step.due (%d ids, %d commands, %d bytes of raw commands)", len(step.IDs), len(step.Commands), raw), int(due))
	}
	return nil
}
