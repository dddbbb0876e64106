package httpapi

// The operators' endpoints of the outbox and of delivery
// (docs/reference.md, "For operators"): events by state, one delivered
// again now, and delivery paused or resumed for every worker.

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// EventStore is what the operators' event and delivery endpoints need of
// the storage.
type EventStore interface {
	ListEvents(ctx context.Context, state string, after int64, limit int) (storage.EventPage, error)
	ReleaseOrDeliverEvent(ctx context.Context, eventID string) (string, error)
	DeliveryState(ctx context.Context) (storage.DeliveryState, error)
	SetDeliveryPaused(ctx context.Context, paused bool) (storage.DeliveryState, error)
}

func (s *Server) registerOperatorEvents() {
	s.handle("GET /v1/events", "list_events", s.auth(takes(s.listEvents, "state", "limit", "after")))
	s.handle("POST /v1/events/{event_id}/deliver", "deliver_event", s.auth(s.deliverEvent))
	s.handle("GET /v1/delivery", "delivery_state", s.auth(s.deliveryState))
	s.handle("POST /v1/delivery/pause", "pause_delivery", s.auth(s.setDelivery(true)))
	s.handle("POST /v1/delivery/resume", "resume_delivery", s.auth(s.setDelivery(false)))
}

type eventList struct {
	Events []storage.OutboxEntry `json:"events"`
	Next   string                `json:"next,omitempty"` // absent on the last page
}

func (s *Server) listEvents(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, after, err := pageParams(q.Get("limit"), q.Get("after"))
	if err != nil {
		respondError(w, r, err, "listing events")
		return
	}
	page, err := s.cfg.Store.ListEvents(r.Context(), q.Get("state"), after, limit)
	if err != nil {
		respondError(w, r, err, "listing events")
		return
	}
	out := eventList{Events: page.Events}
	if page.After != 0 {
		out.Next = cursor(page.After)
	}
	writeJSON(w, http.StatusOK, out)
}

// pageParams reads limit and after, the cursor a previous page's next
// gave. The cursor is opaque to clients: a row id, encoded.
func pageParams(limit, after string) (int, int64, error) {
	n, err := pageLimit(limit)
	if err != nil {
		return 0, 0, err
	}
	var id int64
	if after != "" {
		b, err := base64.RawURLEncoding.DecodeString(after)
		if err == nil {
			id, err = strconv.ParseInt(string(b), 10, 64)
		}
		if err != nil || id < 1 {
			return 0, 0, storage.Errorf(storage.EInvalid, "after: %q is not a cursor a previous page returned as next", oneLine(after))
		}
	}
	return n, id, nil
}

func cursor(id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(id, 10)))
}

// deliverEvent releases a held event, or makes a failing one due now; the
// next claim by any worker takes it. 202: delivery itself is the worker's.
func (s *Server) deliverEvent(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("event_id")
	done, err := s.cfg.Store.ReleaseOrDeliverEvent(r.Context(), id)
	if err != nil {
		respondError(w, r, err, "delivering the event again")
		return
	}
	zerolog.Ctx(r.Context()).Info().Str(logkeys.EventID, id).Str("done", done).Msg("event delivered again by an operator")
	writeJSON(w, http.StatusAccepted, map[string]string{"event_id": id, "done": done})
}

func (s *Server) deliveryState(w http.ResponseWriter, r *http.Request) {
	st, err := s.cfg.Store.DeliveryState(r.Context())
	if err != nil {
		respondError(w, r, err, "reading whether delivery is paused")
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// setDelivery pauses or resumes delivery by every worker: once a pause is
// answered, no worker claims an event until a resume.
func (s *Server) setDelivery(paused bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		st, err := s.cfg.Store.SetDeliveryPaused(r.Context(), paused)
		if err != nil {
			respondError(w, r, err, fmt.Sprintf("setting delivery paused=%v", paused))
			return
		}
		zerolog.Ctx(r.Context()).Info().Bool("paused", st.Paused).Msg("delivery paused or resumed by an operator")
		writeJSON(w, http.StatusOK, st)
	}
}
