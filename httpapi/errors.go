package httpapi

// The one place errors become HTTP answers: every error is one JSON line.

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
	"github.com/stepcollect/stepcollect/storage"
)

// errorBody is every error answer: one line naming the field or the
// conflicting row.
type errorBody struct {
	Error     string `json:"error"`
	RequestID string `json:"request_id,omitempty"`
}

// maxErrorLine bounds an error answer's one line.
const maxErrorLine = 2048

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if p, ok := r.Context().Value(refusalKey).(*string); ok {
		*p = msg
	}
	writeJSON(w, status, errorBody{Error: msg, RequestID: RequestID(r.Context())})
}

// statusOf is the one place domain errors become HTTP statuses. Anything
// that is not a domain error means the storage could not do its work
// (MySQL unreachable, mostly): 503, and nothing was half-written, because
// every change is one transaction.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	var be *bodyadmit.Error
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.As(err, &be):
		return be.Status
	case storage.ErrorCode(err) == storage.EInvalid:
		return http.StatusBadRequest
	case storage.ErrorCode(err) == storage.ETooLarge:
		return http.StatusRequestEntityTooLarge
	case storage.ErrorCode(err) == storage.EConflict:
		return http.StatusConflict
	case storage.ErrorCode(err) == storage.ENotFound:
		return http.StatusNotFound
	}
	return http.StatusServiceUnavailable
}

// respondError answers err with its status. Domain errors say what is
// wrong; others are logged in full and answered without internals.
func respondError(w http.ResponseWriter, r *http.Request, err error, what string) {
	status := statusOf(err)
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeError(w, r, status, fmt.Sprintf("body: larger than the %d-byte limit (-max-body-bytes)", mbe.Limit))
	case errors.As(err, new(*bodyadmit.Error)):
		writeError(w, r, status, err.Error())
	case errors.Is(err, storage.ErrCommitUnknown):
		// the one 5xx after which the work may be done: say so, rather
		// than "nothing was written"
		zerolog.Ctx(r.Context()).Error().Err(err).Msg(what)
		writeError(w, r, status, what+": storage unavailable after a COMMIT whose answer was lost: it may have been written (sent again, it is stored once at most)")
	case status == http.StatusServiceUnavailable:
		zerolog.Ctx(r.Context()).Error().Err(err).Msg(what)
		writeError(w, r, status, what+": storage unavailable, nothing was written; retry later")
	default:
		// room for the names the message is there to give (an id and a
		// UUID can be 255 and 127 bytes, a workflow and its instance 255
		// each); what it quotes of the input is bounded where it is quoted
		writeError(w, r, status, bodyadmit.OneLineMax(err.Error(), maxErrorLine))
	}
}
