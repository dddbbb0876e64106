package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
	var out []*storage.OutboxEvent
	var after int64
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
		after = s.claims.from(now)
		var err error
		out, err = queryList(ctx, tx, qClaimDueEvents, []any{after, dbTime(now), limit}, func(rs *sql.Rows) (*storage.OutboxEvent, error) {
			ev := &storage.OutboxEvent{}
			var age int64
			err := rs.Scan(&ev.ID, &ev.EventID, &ev.Type, &ev.Payload, &ev.Attempts, &age)
			ev.Attempts++ // this one
			ev.Age = time.Duration(age) * time.Microsecond
			return ev, err
		})
		if err != nil || len(out) == 0 {
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
	s.claims.claimed(after, out, limit)
	return out, nil
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
	if len(reason) > 1000 {
		reason = reason[:1000]
	}
	if _, err := s.db.ExecContext(ctx, qFailEvent, reason, dbTime(retryAt), dbTime(retryAt), ev.ID, ev.EventID); err != nil {
		return fmt.Errorf("recording failed delivery of event %s (outbox row %d): %w", ev.EventID, ev.ID, err)
	}
	return nil
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
