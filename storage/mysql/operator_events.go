package mysql

// The operators' side of the outbox (docs/reference.md, "The outbox"):
// events listed by state, held events set aside and released, one event
// made due now, and delivery paused or resumed for every worker.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/stepcollect/stepcollect/storage"
)

// HoldEvent records a failed delivery and holds the event: no worker
// claims it again until an operator releases it (ReleaseOrDeliverEvent).
func (s *Storage) HoldEvent(ctx context.Context, ev storage.OutboxRef, reason string) error {
	if _, err := s.db.ExecContext(ctx, qHoldEvent, errorText(reason), ev.ID, ev.EventID); err != nil {
		return fmt.Errorf("holding event %s (outbox row %d): %w", ev.EventID, ev.ID, err)
	}
	return nil
}

// What ReleaseOrDeliverEvent did.
const (
	EventReleased  = "released"  // it was held; it is pending and due now
	EventMadeDue   = "due_now"   // it was waiting out a backoff; it is due now
	EventUnchanged = "unchanged" // it was due already, or in delivery right now
)

// ReleaseOrDeliverEvent releases a held event (its attempts and age start
// afresh) or ends a failed event's backoff, so that the next claim by any
// worker takes it. It says which it did. An event the outbox does not hold
// is an error wrapping storage.ErrEventNotFound.
func (s *Storage) ReleaseOrDeliverEvent(ctx context.Context, eventID string) (string, error) {
	for _, step := range []struct {
		q    string
		done string
	}{{qReleaseEvent, EventReleased}, {qDeliverEventNow, EventMadeDue}} {
		res, err := s.db.ExecContext(ctx, step.q, eventID)
		if err != nil {
			return "", fmt.Errorf("delivering event %s now: %w", eventID, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return "", fmt.Errorf("delivering event %s now: %w", eventID, err)
		} else if n > 0 {
			return step.done, nil
		}
	}
	var one int
	err := s.db.QueryRowContext(ctx, qOutboxHasEvent, eventID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("event %q: %w", eventID, storage.ErrEventNotFound)
	} else if err != nil {
		return "", fmt.Errorf("delivering event %s now: %w", eventID, err)
	}
	return EventUnchanged, nil
}

// EndBackoffs makes up to limit events that wait out a backoff after a
// failed delivery due now, as "deliver now" does for one, and says how
// many. The dispatcher calls it when its receiver answers again after a
// run of failures: what failed while it was down is then delivered at
// once, not each at the end of its backoff (up to the 10 s cap).
func (s *Storage) EndBackoffs(ctx context.Context, limit int) (int64, error) {
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	res, err := s.db.ExecContext(ctx, qEndBackoffs, limit)
	if err != nil {
		return 0, fmt.Errorf("ending the backoffs of failed events: %w", err)
	}
	return res.RowsAffected()
}

// ListEvents returns up to limit events after the row after (0: from the
// start), oldest first, in state (empty: every state). page.After is 0
// once there are no more.
func (s *Storage) ListEvents(ctx context.Context, state string, after int64, limit int) (storage.EventPage, error) {
	q := qListEvents
	switch state {
	case "":
	case storage.EventPending:
		q = qListEventsPending
	case storage.EventFailing:
		q = qListEventsFailing
	case storage.EventHeld:
		q = qListEventsHeld
	default:
		return storage.EventPage{}, storage.Errorf(storage.EInvalid, "state: %q is not one of %v", state, storage.EventStates)
	}
	if limit < 1 {
		return storage.EventPage{}, storage.Errorf(storage.EInvalid, "limit: %d is less than 1", limit)
	}
	evs, err := queryList(ctx, s.db, q, []any{after, limit + 1}, func(rs *sql.Rows) (storage.OutboxEntry, error) {
		var e storage.OutboxEntry
		var enrollment, lastError sql.NullString
		var next sql.NullTime
		var held bool
		err := rs.Scan(&e.ID, &e.EventID, &e.Type, &e.StepID, &enrollment, &e.CreatedAt, &e.Attempts, &lastError, &held, &next)
		if enrollment.Valid {
			e.EnrollmentID = &enrollment.String
		}
		if lastError.Valid {
			e.LastError = &lastError.String
		}
		if next.Valid {
			t := next.Time.UTC()
			e.NextAttemptAt = &t
		}
		e.CreatedAt = e.CreatedAt.UTC()
		switch {
		case held:
			e.State = storage.EventHeld
		case lastError.Valid:
			e.State = storage.EventFailing
		default:
			e.State = storage.EventPending
		}
		return e, err
	})
	if err != nil {
		return storage.EventPage{}, fmt.Errorf("listing events after row %d: %w", after, err)
	}
	var page storage.EventPage
	if len(evs) > limit {
		evs = evs[:limit]
		page.After = evs[limit-1].ID
	}
	page.Events = evs
	if page.Events == nil {
		page.Events = []storage.OutboxEntry{}
	}
	return page, nil
}

// DeliveryState says whether delivery is paused, for every worker.
func (s *Storage) DeliveryState(ctx context.Context) (storage.DeliveryState, error) {
	var st storage.DeliveryState
	var since sql.NullTime
	err := s.db.QueryRowContext(ctx, qGetDelivery).Scan(&st.Paused, &since)
	if err != nil && !errors.Is(err, sql.ErrNoRows) { // no row: never paused
		return st, fmt.Errorf("reading whether delivery is paused: %w", err)
	}
	if since.Valid {
		t := since.Time.UTC()
		st.Since = &t
	}
	return st, nil
}

// SetDeliveryPaused pauses or resumes delivery by every worker and returns
// the state it left. A pause waits for the claims already running (they
// read the state with a shared lock): once it returns, no worker claims
// an event until delivery is resumed. Deliveries claimed before it finish.
//
// The write and the read of what it left are one transaction, the read a
// locking one under the write's own row lock: a pause and a resume sent at
// once are applied one after the other, and each caller is told the state
// its own write left (the later one's stands). Read apart, the earlier
// writer could read the later one's state and took its own for lost.
func (s *Storage) SetDeliveryPaused(ctx context.Context, paused bool) (storage.DeliveryState, error) {
	var st storage.DeliveryState
	err := s.inTx(ctx, storage.OpSetDeliveryPaused, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
		st = storage.DeliveryState{}
		if _, err := tx.ExecContext(ctx, qSetDelivery, paused, paused); err != nil {
			return err
		}
		var since sql.NullTime
		err := tx.QueryRowContext(ctx, qLockDelivery).Scan(&st.Paused, &since)
		if errors.Is(err, sql.ErrNoRows) {
			// its row is missing (the migration writes it): write it, and
			// set it again
			if _, err := tx.ExecContext(ctx, qEnsureDelivery); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, qSetDelivery, paused, paused); err != nil {
				return err
			}
			err = tx.QueryRowContext(ctx, qLockDelivery).Scan(&st.Paused, &since)
		}
		if err != nil {
			return err
		}
		if since.Valid {
			t := since.Time.UTC()
			st.Since = &t
		}
		if st.Paused != paused {
			return fmt.Errorf("read paused=%v under its own write's lock", st.Paused)
		}
		return nil
	})
	if err != nil {
		return storage.DeliveryState{}, fmt.Errorf("setting delivery paused=%v: %w", paused, err)
	}
	return st, nil
}
