package mysql

import (
	"context"
	"database/sql"
	"fmt"

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

// tooLarge is the refusal of something whose event (or statement) would
// take n bytes: one line naming the limit and where it comes from.
func (s *Storage) tooLarge(what string, n int) error {
	return storage.Errorf(storage.ETooLarge, "%s would take %d bytes, more than the %d bytes an event or statement may take (derived from the server's max_allowed_packet, %d bytes)",
		what, n, s.eventLimit(), s.maxPacket)
}

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
