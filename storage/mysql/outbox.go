package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/storage"
)

// insertEvent writes ev to the outbox inside tx and returns its row. An
// event its INSERT could not carry is a storage.ETooLarge error, and is
// never sent: the server would refuse it and drop the connection.
func (s *Storage) insertEvent(ctx context.Context, tx *sql.Tx, ev *events.Event, enrollment string) (storage.OutboxRef, error) {
	row, err := s.outboxRow(ev, enrollment)
	if err != nil {
		return storage.OutboxRef{}, err
	}
	res, err := tx.ExecContext(ctx, qInsertOutbox, row...)
	if err != nil {
		return storage.OutboxRef{}, fmt.Errorf("writing %s event %s to the outbox: %w", ev.Type, ev.EventID, err)
	}
	id, err := res.LastInsertId()
	if err != nil {
		return storage.OutboxRef{}, fmt.Errorf("writing %s event %s to the outbox: %w", ev.Type, ev.EventID, err)
	}
	return storage.OutboxRef{ID: id, EventID: ev.EventID, Type: ev.Type}, nil
}

// outboxRow is ev's qInsertOutbox arguments, or the storage.ETooLarge
// error of an event its INSERT could not carry.
func (s *Storage) outboxRow(ev *events.Event, enrollment string) ([]any, error) {
	payload, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encoding %s event: %w", ev.Type, err)
	}
	if escapedOver(payload, s.eventLimit()) {
		return nil, fmt.Errorf("writing %s event %s to the outbox: %w", ev.Type, ev.EventID, s.tooLarge("event", "the event", escapedLen(payload)))
	}
	return []any{ev.EventID, ev.Type, ev.Step.StepID, nullString(enrollment), payload}, nil
}

// ClaimDueEvents claims up to limit events that nobody is delivering, for
// lease, in one short transaction, and returns them oldest first. Events
// another worker holds are skipped, never waited for; held events are
// never claimed. While delivery is paused it claims nothing and returns
// storage.ErrDeliveryPaused.
func (s *Storage) ClaimDueEvents(ctx context.Context, limit int, lease time.Duration) ([]*storage.OutboxEvent, error) {
	var after int64
	out, err := s.claimEvents(ctx, lease, func(ctx context.Context, tx *sql.Tx, now time.Time) ([]*storage.OutboxEvent, error) {
		after = s.claims.from(now)
		return scanClaimed(ctx, tx, qClaimDueEvents, after, dbTime(now), limit)
	})
	if err != nil {
		return nil, err
	}
	s.claims.claimed(after, out, limit)
	return out, nil
}

// ClaimProbeEvent claims one event nobody is delivering, for a worker
// probing a receiver that failed every recent try: the newest one, or
// (newest false) the first at or after a random row id in the outbox's
// range, wrapping to the start. A probe in claim order would take the
// oldest event each time; where the receiver fails only some events (a
// workflow whose handler answers 503), those can be the oldest for hours
// and the probe would never find one it takes. It returns nil when
// nothing is due, and storage.ErrDeliveryPaused while delivery is paused.
func (s *Storage) ClaimProbeEvent(ctx context.Context, lease time.Duration, newest bool) (*storage.OutboxEvent, error) {
	out, err := s.claimEvents(ctx, lease, func(ctx context.Context, tx *sql.Tx, now time.Time) ([]*storage.OutboxEvent, error) {
		if newest {
			return scanClaimed(ctx, tx, qClaimNewestDueEvent, dbTime(now))
		}
		var lo, hi sql.NullInt64
		if err := tx.QueryRowContext(ctx, qOutboxIDRange).Scan(&lo, &hi); err != nil || !lo.Valid {
			return nil, err
		}
		from := lo.Int64 + rand.Int64N(hi.Int64-lo.Int64+1)
		out, err := scanClaimed(ctx, tx, qClaimDueEvents, from-1, dbTime(now), 1)
		if err != nil || len(out) > 0 || from == lo.Int64 {
			return out, err
		}
		return scanClaimed(ctx, tx, qClaimDueEvents, 0, dbTime(now), 1)
	})
	if err != nil || len(out) == 0 {
		return nil, err
	}
	return out[0], nil
}

// claimEvents runs a claim: unless delivery is paused, read locks the
// events it returns, and they are leased for lease, all in one short
// transaction.
func (s *Storage) claimEvents(ctx context.Context, lease time.Duration, read func(context.Context, *sql.Tx, time.Time) ([]*storage.OutboxEvent, error)) ([]*storage.OutboxEvent, error) {
	var out []*storage.OutboxEvent
	err := s.inTx(ctx, storage.OpClaimEvents, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
		out = nil
		var paused sql.NullBool
		if err := tx.QueryRowContext(ctx, qClaimsDelivery).Scan(&paused); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if paused.Bool {
			return storage.ErrDeliveryPaused
		}
		now := time.Now()
		var err error
		if out, err = read(ctx, tx, now); err != nil || len(out) == 0 {
			return err
		}
		ids := make([]int64, len(out))
		for i, ev := range out {
			ids[i] = ev.ID
		}
		_, err = tx.ExecContext(ctx, expand(qLeaseEvents, len(ids)), args(ids, dbTime(now.Add(lease)))...)
		return err
	})
	if errors.Is(err, storage.ErrDeliveryPaused) {
		return nil, err
	} else if err != nil {
		return nil, fmt.Errorf("claiming events to deliver: %w", err)
	}
	return out, nil
}

// scanClaimed reads the events a claim's locking read q returns.
func scanClaimed(ctx context.Context, tx *sql.Tx, q string, a ...any) ([]*storage.OutboxEvent, error) {
	return queryList(ctx, tx, q, a, func(rs *sql.Rows) (*storage.OutboxEvent, error) {
		ev := &storage.OutboxEvent{}
		var age int64
		err := rs.Scan(&ev.ID, &ev.EventID, &ev.Type, &ev.Payload, &ev.Attempts, &age)
		ev.Attempts++ // this one
		ev.Age = time.Duration(age) * time.Microsecond
		return ev, err
	})
}

// RenewLeases extends the lease of events whose delivery is still running.
// Like AckEvents it runs through inTx, so a lock wait timeout or a
// deadlock under load is retried rather than costing the lease.
func (s *Storage) RenewLeases(ctx context.Context, evs []storage.OutboxRef, lease time.Duration) error {
	until := time.Now().Add(lease)
	return chunks(evs, maxInList, func(c []storage.OutboxRef) error {
		ids, eventIDs := refKeys(c)
		err := s.inTx(ctx, storage.OpRenewLeases, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			_, err := tx.ExecContext(ctx, expand(qRenewLeases, len(c), len(c)), append(args(ids, dbTime(until)), args(eventIDs)...)...)
			return err
		})
		if err != nil {
			return fmt.Errorf("renewing the lease of events %v: %w", ids, err)
		}
		return nil
	})
}

// AckEvents removes delivered events from the outbox, in one statement,
// retried on a lock wait timeout or a deadlock: an acknowledgement lost
// to one would be a redelivery once the lease lapses.
func (s *Storage) AckEvents(ctx context.Context, evs []storage.OutboxRef) error {
	return chunks(evs, maxInList, func(c []storage.OutboxRef) error {
		ids, eventIDs := refKeys(c)
		err := s.inTx(ctx, storage.OpAckEvents, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			_, err := tx.ExecContext(ctx, expand(qAckEvents, len(c), len(c)), append(args(ids), args(eventIDs)...)...)
			return err
		})
		if err != nil {
			return fmt.Errorf("acknowledging events %v: %w", ids, err)
		}
		return nil
	})
}

// refKeys are the row ids and the event ids of evs, in order.
func refKeys(evs []storage.OutboxRef) ([]int64, []string) {
	ids, eventIDs := make([]int64, len(evs)), make([]string, len(evs))
	for i, ev := range evs {
		ids[i], eventIDs[i] = ev.ID, ev.EventID
	}
	return ids, eventIDs
}

// FailEvent records a failed delivery and leaves the event alone until
// retryAt, when its lease lapses and the dispatcher claims it again.
func (s *Storage) FailEvent(ctx context.Context, ev storage.OutboxRef, reason string, retryAt time.Time) error {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	if _, err := s.db.ExecContext(ctx, qFailEvent, errorText(reason), dbTime(retryAt), dbTime(retryAt), ev.ID, ev.EventID); err != nil {
		return fmt.Errorf("recording failed delivery of event %s (outbox row %d): %w", ev.EventID, ev.ID, err)
	}
	return nil
}

// errorText is reason as last_error can hold it: valid UTF-8 (a receiver's
// status line may be Latin-1) of at most 1000 bytes, cut between characters.
func errorText(reason string) string {
	reason = strings.ToValidUTF8(reason, "\uFFFD")
	if len(reason) <= 1000 {
		return reason
	}
	cut := 1000
	for !utf8.RuneStart(reason[cut]) {
		cut--
	}
	return reason[:cut]
}

// Gauges reads what every replica exports at scrape time: the outbox and
// the last sweep's findings, as the database holds them now.
func (s *Storage) Gauges(ctx context.Context) (storage.Gauges, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	var g storage.Gauges
	var oldest, swept sql.NullInt64
	var uncollected sql.NullFloat64
	var paused sql.NullBool
	if err := s.db.QueryRowContext(ctx, qGauges).Scan(&g.OutboxPending, &oldest, &uncollected, &swept, &g.OutboxHeld, &paused, &g.SetAside); err != nil {
		return g, fmt.Errorf("reading gauges: %w", err)
	}
	g.OldestEventAge = time.Duration(oldest.Int64) * time.Microsecond
	g.UncollectedSteps = int(uncollected.Float64)
	g.Swept = swept.Valid
	g.LastSweepAge = time.Duration(swept.Int64) * time.Microsecond
	g.DeliveryPaused = paused.Bool
	return g, nil
}
