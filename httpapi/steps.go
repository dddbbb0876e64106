package httpapi

import (
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
)

// stepRequest is POST /v1/steps's body.
type stepRequest struct {
	WorkflowName string           `json:"workflow_name"`
	InstanceID   string           `json:"instance_id"`
	StepName     string           `json:"step_name"`
	Context      string           `json:"context"` // standard base64
	IDs          []string         `json:"ids"`
	Commands     []commandRequest `json:"commands"`
	NotUntil     string           `json:"not_until"` // RFC 3339
	Timeout      string           `json:"timeout"`   // RFC 3339
}

type commandRequest struct {
	CommandUUID string `json:"command_uuid"`
	RequestType string `json:"request_type"`
	Command     string `json:"command"` // standard base64 of the command plist
}

// enqueueStep stores one step for many enrollments, atomically.
func (s *Server) enqueueStep(w http.ResponseWriter, r *http.Request) {
	step, err := decodeStep(r.Body)
	if err != nil {
		respondError(w, r, err, "decoding the step")
		return
	}
	id, err := s.cfg.Store.StoreStepID(r.Context(), step, time.Now())
	if err != nil {
		respondError(w, r, err, "storing the step")
		return
	}
	zerolog.Ctx(r.Context()).Info().Int64(logkeys.StepID, id).Str(logkeys.WorkflowName, step.WorkflowName).
		Str(logkeys.InstanceID, step.InstanceID).Int(logkeys.Count, len(step.IDs)).Msg("step enqueued")
	w.Header().Set("Location", "/v1/steps/"+strconv.FormatInt(id, 10))
	writeJSON(w, http.StatusCreated, map[string]int64{"step_id": id})
}

func decodeStep(body io.Reader) (*nanostorage.StepEnqueuingWithConfig, error) {
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields() // a misspelt field is an error, not a silent default
	var req stepRequest
	if err := dec.Decode(&req); err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, err
		}
		if msg, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return nil, invalid("body: unknown field " + msg)
		}
		if errors.Is(err, io.EOF) {
			return nil, invalid("body: empty; want the step as a JSON object")
		}
		return nil, invalid(jsonProblem(err))
	}
	step := &nanostorage.StepEnqueuingWithConfig{}
	step.WorkflowName, step.InstanceID, step.Name, step.IDs = req.WorkflowName, req.InstanceID, req.StepName, req.IDs
	var err error
	if step.Context, err = b64("context", req.Context); err != nil {
		return nil, err
	}
	for i, c := range req.Commands {
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
	return step, nil
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
	return t, nil
}

// stepStatus reports a step while it exists; 404 once collected.
func (s *Server) stepStatus(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("step_id"), 10, 64)
	if err != nil || id < 1 {
		writeError(w, r, http.StatusBadRequest, fmt.Sprintf("step_id: %q is not a step id", oneLine(r.PathValue("step_id"))))
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
