package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// stepRequest is POST /v1/steps's body.
type stepRequest struct {
	WorkflowName string                      `json:"workflow_name"`
	InstanceID   string                      `json:"instance_id"`
	StepName     string                      `json:"step_name"`
	Context      string                      `json:"context"` // standard base64
	IDs          countedList[string]         `json:"ids"`
	Commands     countedList[commandRequest] `json:"commands"`
	NotUntil     string                      `json:"not_until"` // RFC 3339
	Timeout      string                      `json:"timeout"`   // RFC 3339
}

type commandRequest struct {
	CommandUUID string `json:"command_uuid"`
	RequestType string `json:"request_type"`
	Command     string `json:"command"` // standard base64 of the command plist
}

// enqueueStep stores one step for many enrollments, atomically.
func (s *Server) enqueueStep(w http.ResponseWriter, r *http.Request, body []byte, err error) {
	if err != nil {
		respondError(w, r, err, "decoding the step")
		return
	}
	if err := checkUTF8(body); err != nil {
		respondError(w, r, err, "decoding the step")
		return
	}
	step, err := decodeStep(body, s.stepLimits)
	if err != nil {
		respondError(w, r, err, "decoding the step")
		return
	}
	now := time.Now()
	if step.Timeout.IsZero() && s.cfg.DefaultStepTimeout > 0 {
		// from when the commands go out: a not_until step's clock starts then
		from := now
		if step.NotUntil.After(now) {
			from = step.NotUntil
		}
		step.Timeout = from.Add(s.cfg.DefaultStepTimeout).Truncate(time.Second)
		if step.Timeout.After(storage.LastStorableTime) {
			// the caller sent no timeout: one it did not send must not
			// refuse a not_until that MySQL can store
			step.Timeout = storage.LastStorableTime
		}
	}
	id, err := s.cfg.Store.StoreStepID(r.Context(), step, now)
	if err != nil {
		respondError(w, r, err, "storing the step")
		return
	}
	zerolog.Ctx(r.Context()).Info().Int64(logkeys.StepID, id).Str(logkeys.WorkflowName, step.WorkflowName).
		Str(logkeys.InstanceID, step.InstanceID).Int(logkeys.Count, len(step.IDs)).Msg("step enqueued")
	w.Header().Set("Location", "/v1/steps/"+strconv.FormatInt(id, 10))
	writeJSON(w, http.StatusCreated, map[string]int64{"step_id": id})
}

// stepLimits bound one step: its ids, its commands, and the id_commands
// rows they make (ids x commands), each a flag of cmd/api.
type stepLimits struct{ ids, commands, rows int }

// DefaultMaxStepIDs, DefaultMaxStepCommands and DefaultMaxStepRows are
// stepLimits' defaults: a fleet-wide step to 100,000 enrollments, or 1,000
// commands to a few, but not both at once: every id x command is a row
// written in the step's one transaction.
const (
	DefaultMaxStepIDs      = 100_000
	DefaultMaxStepCommands = 1_000
	DefaultMaxStepRows     = 1_000_000
)

// check refuses counts over a limit (413), naming the field, the count, the
// limit and the flag that sets it. The product comes first: it is what
// costs, and the one a client is most likely to exceed with each count
// within its own limit.
func (l stepLimits) check(ids, commands int) error {
	switch {
	case int64(ids)*int64(commands) > int64(l.rows):
		return storage.Errorf(storage.ETooLarge, "ids x commands: %d rows, more than the %d allowed (-max-step-rows)", int64(ids)*int64(commands), l.rows)
	case ids > l.ids:
		return storage.Errorf(storage.ETooLarge, "ids: %d ids, more than the %d allowed (-max-step-ids)", ids, l.ids)
	case commands > l.commands:
		return storage.Errorf(storage.ETooLarge, "commands: %d commands, more than the %d allowed (-max-step-commands)", commands, l.commands)
	}
	return nil
}

// decodeStep decodes POST /v1/steps's body. Every error is a one-line
// storage.Error naming the field: EInvalid, or ETooLarge for a step over
// lim, refused before any of its lists is built beyond the limit.
func decodeStep(body []byte, lim stepLimits) (*nanostorage.StepEnqueuingWithConfig, error) {
	if err := checkSurrogates(body); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields() // a misspelt field is an error, not a silent default
	req := stepRequest{IDs: countedList[string]{max: lim.ids}, Commands: countedList[commandRequest]{max: lim.commands}}
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		if msg, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return nil, invalid("body: unknown field " + oneLine(msg))
		}
		if errors.Is(err, io.EOF) {
			return nil, invalid("body: empty; want the step as a JSON object")
		}
		return nil, invalid(jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		// as the webhook's json.Unmarshal refuses it: a second object is
		// a client's mistake (two steps in one body?), never ignored
		return nil, invalid(fmt.Sprintf("body: more after the step's JSON object (at byte %d); send one object", dec.InputOffset()))
	}
	if err := lim.check(req.IDs.count(), req.Commands.count()); err != nil {
		return nil, err
	}
	step := &nanostorage.StepEnqueuingWithConfig{}
	step.WorkflowName, step.InstanceID, step.Name, step.IDs = req.WorkflowName, req.InstanceID, req.StepName, req.IDs.items
	var err error
	if step.Context, err = b64("context", req.Context); err != nil {
		return nil, err
	}
	for i, c := range req.Commands.items {
		raw, err := b64(fmt.Sprintf("commands[%d].command", i), c.Command)
		if err != nil {
			return nil, err
		}
		step.Commands = append(step.Commands, nanostorage.StepCommandRaw{CommandUUID: c.CommandUUID, RequestType: c.RequestType, Command: raw})
	}
	if step.NotUntil, err = rfc3339("not_until", req.NotUntil); err != nil {
		return nil, err
	}
	if step.Timeout, err = rfc3339("timeout", req.Timeout); err != nil {
		return nil, err
	}
	if !step.NotUntil.IsZero() && !step.Timeout.IsZero() && !step.Timeout.After(step.NotUntil) {
		return nil, invalid(fmt.Sprintf("timeout: %s is not after not_until (%s): the step would time out before it is sent",
			step.Timeout.UTC().Format(time.RFC3339), step.NotUntil.UTC().Format(time.RFC3339)))
	}
	return step, nil
}

// countedList is a JSON array whose elements are counted before any is
// decoded, and decoded only when there are at most max of them: a body of
// millions of {} (3 bytes each in the body, 48 as a commandRequest) is
// refused without becoming millions of structs. The caller checks count
// against the limits once the whole body is decoded, when it knows every
// count (the rows limit needs both lists').
type countedList[T any] struct {
	max   int
	n     int // elements as sent, when more than max
	items []T
}

func (l *countedList[T]) UnmarshalJSON(b []byte) error {
	l.items, l.n = nil, 0
	if n := countElements(b); n > l.max {
		l.n = n
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(&l.items)
}

func (l *countedList[T]) count() int {
	if l.n > len(l.items) {
		return l.n
	}
	return len(l.items)
}

// countElements counts the elements of b, a JSON value the decoder has
// already checked (encoding/json validates before it unmarshals), without
// decoding any; -1 when b is not an array.
func countElements(b []byte) int {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 || b[0] != '[' {
		return -1
	}
	depth, commas, empty, inString, escaped := 0, 0, true, false, false
	for _, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case ' ', '\t', '\r', '\n':
		case ']', '}':
			depth--
		case ',':
			if depth == 1 {
				commas++
			}
		default:
			if depth == 1 {
				empty = false
			}
			switch c {
			case '"':
				inString = true
			case '[', '{':
				depth++
			}
		}
	}
	if empty {
		return 0
	}
	return commas + 1
}

func b64(field, s string) ([]byte, error) {
	if s == "" {
		return nil, nil
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, invalid(field + ": not standard base64: " + err.Error())
	}
	return b, nil
}

func rfc3339(field, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, invalid(fmt.Sprintf("%s: %q is not an RFC 3339 time (like 2026-12-01T00:00:00Z)", field, oneLine(s)))
	}
	if t.IsZero() {
		// the zero time is "not set" from here on: refused as the storage
		// refuses every other time it cannot store
		return time.Time{}, invalid(fmt.Sprintf("%s: %s is outside what MySQL can store (1970-01-01T00:00:01Z to %s)",
			field, oneLine(s), storage.LastStorableTime.Format(time.RFC3339)))
	}
	return t, nil
}

// stepStatus reports a step while it exists; 404 once collected.
func (s *Server) stepStatus(w http.ResponseWriter, r *http.Request) {
	id, ok := stepIDParam(w, r)
	if !ok {
		return
	}
	st, err := s.cfg.Store.StepStatus(r.Context(), id)
	if err != nil {
		respondError(w, r, err, "reading the step")
		return
	}
	writeJSON(w, http.StatusOK, st)
}

// cancelSteps cancels an enrollment's steps, all or one workflow's.
func (s *Server) cancelSteps(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	wf := r.URL.Query().Get("workflow_name")
	if err := s.cfg.Store.CancelSteps(r.Context(), id, wf); err != nil {
		respondError(w, r, err, "cancelling steps")
		return
	}
	zerolog.Ctx(r.Context()).Info().Str(logkeys.EnrollmentID, id).Str(logkeys.WorkflowName, wf).Msg("steps cancelled")
	w.WriteHeader(http.StatusNoContent)
}
