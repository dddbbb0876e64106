package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/micromdm/nanocmd/workflow"

	"github.com/stepcollect/stepcollect/storage"
)

// wfStatusRowsPerUpsert bounds one multi-row upsert into wf_status.
const wfStatusRowsPerUpsert = 1000

// RetrieveWorkflowStarted returns when workflowName was last started for id,
// or the zero time if never.
func (s *Storage) RetrieveWorkflowStarted(ctx context.Context, id, workflowName string) (time.Time, error) {
	if !s.holds(ctx, id, workflowName) {
		return time.Time{}, nil
	}
	var epoch int64
	err := s.db.QueryRowContext(ctx, qGetWorkflowStarted, id, workflowName).Scan(&epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	} else if err != nil {
		return time.Time{}, fmt.Errorf("workflow started (enrollment %s, workflow %s): %w", id, workflowName, err)
	}
	return time.Unix(epoch, 0), nil
}

// RecordWorkflowStarted records that workflowName started for ids at started.
func (s *Storage) RecordWorkflowStarted(ctx context.Context, ids []string, workflowName string, started time.Time) error {
	if len(ids) == 0 {
		return storage.Errorf(storage.EInvalid, "record workflow started: ids: empty")
	}
	unix := started.Unix()
	err := chunks(ids, wfStatusRowsPerUpsert, func(c []string) error {
		vals := make([]any, 0, 3*len(c))
		for _, id := range c {
			vals = append(vals, id, workflowName, unix)
		}
		rows := qRecordWorkflowStartedFirst + strings.Repeat(qRecordWorkflowStartedNext, len(c)-1)
		return s.inTx(ctx, storage.OpRecordStarted, func(ctx context.Context, tx *sql.Tx, _ *attempt) error {
			_, err := tx.ExecContext(ctx, fmt.Sprintf(qRecordWorkflowStarted, rows), vals...)
			return err
		})
	})
	if err != nil {
		return fmt.Errorf("record workflow started (workflow %s, %d ids): %w", workflowName, len(ids), err)
	}
	return nil
}

// ClearWorkflowStatus forgets every workflow start time of id.
func (s *Storage) ClearWorkflowStatus(ctx context.Context, id string) error {
	if !s.holds(ctx, id) {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, qClearWorkflowStatus, id); err != nil {
		return fmt.Errorf("clear workflow status (enrollment %s): %w", id, err)
	}
	return nil
}

// StoreEventSubscription creates or replaces the event subscription name.
func (s *Storage) StoreEventSubscription(ctx context.Context, name string, es *nanostorage.EventSubscription) error {
	if err := es.Validate(); err != nil {
		return storage.Errorf(storage.EInvalid, "event subscription %q: %v", name, err)
	}
	_, err := s.db.ExecContext(ctx, qStoreEvent, name, es.Event, es.Workflow, nullString(es.EventContext), nullString(es.Context))
	if err != nil {
		return fmt.Errorf("store event subscription %q: %w", name, err)
	}
	return nil
}

// RetrieveEventSubscriptions returns the subscriptions of the given names
// that exist, by name.
func (s *Storage) RetrieveEventSubscriptions(ctx context.Context, names []string) (map[string]*nanostorage.EventSubscription, error) {
	out := map[string]*nanostorage.EventSubscription{}
	err := chunks(s.holdable(ctx, names), maxInList, func(c []string) error {
		_, err := queryList(ctx, s.db, expand(qGetEventsByNames, len(c)), args(c), func(rs *sql.Rows) (struct{}, error) {
			name, es, err := scanEvent(rs)
			out[name] = es
			return struct{}{}, err
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("event subscriptions by name: %w", err)
	}
	return out, nil
}

// RetrieveEventSubscriptionsByEvent returns the subscriptions to event f.
func (s *Storage) RetrieveEventSubscriptionsByEvent(ctx context.Context, f workflow.EventFlag) ([]*nanostorage.EventSubscription, error) {
	out, err := queryList(ctx, s.db, qGetEventsByType, []any{f.String()}, func(rs *sql.Rows) (*nanostorage.EventSubscription, error) {
		_, es, err := scanEvent(rs)
		return es, err
	})
	if err != nil {
		return nil, fmt.Errorf("event subscriptions by event %s: %w", f, err)
	}
	return out, nil
}

// DeleteEventSubscription removes the subscription name.
func (s *Storage) DeleteEventSubscription(ctx context.Context, name string) error {
	if !s.holds(ctx, name) {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, qDeleteEvent, name); err != nil {
		return fmt.Errorf("delete event subscription %q: %w", name, err)
	}
	return nil
}

func scanEvent(rs *sql.Rows) (string, *nanostorage.EventSubscription, error) {
	var name string
	var ctxv, evCtx sql.NullString
	es := &nanostorage.EventSubscription{}
	err := rs.Scan(&name, &es.Event, &es.Workflow, &ctxv, &evCtx)
	es.Context, es.EventContext = ctxv.String, evCtx.String
	return name, es, err
}
