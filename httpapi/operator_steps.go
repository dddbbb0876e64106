package httpapi

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// StepOperator is what the operators' step endpoints need of the storage
// (docs/reference.md, "For operators").
type StepOperator interface {
	ListSteps(ctx context.Context, f storage.StepFilter) ([]storage.StepSummary, bool, error)
	StepOutstanding(ctx context.Context, stepID int64, after string, limit int) ([]string, bool, error)
	CancelStep(ctx context.Context, stepID int64) (int, error)
	CancelWorkflowInstance(ctx context.Context, workflowName, instanceID string) (int, error)
}

// DefaultPageLimit is an operator listing's page without `limit`;
// MaxPageLimit the largest one may ask for.
const (
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// listSteps answers GET /v1/steps: steps that still exist, oldest first.
func (s *Server) listSteps(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := storage.StepFilter{WorkflowName: q.Get("workflow_name"), InstanceID: q.Get("instance_id")}
	var err error
	if f.Limit, err = pageLimit(q.Get("limit")); err != nil {
		respondError(w, r, err, "listing steps")
		return
	}
	if v := q.Get("older_than"); v != "" {
		if f.OlderThan, err = time.ParseDuration(v); err != nil || f.OlderThan < 0 {
			writeError(w, r, http.StatusBadRequest, fmt.Sprintf("older_than: %q is not a positive Go duration (like 1h or 72h)", oneLine(v)))
			return
		}
	}
	if v := q.Get("after"); v != "" {
		if f.After, err = decodeStepCursor(v); err != nil {
			respondError(w, r, err, "listing steps")
			return
		}
	}
	steps, more, err := s.cfg.Store.ListSteps(r.Context(), f)
	if err != nil {
		respondError(w, r, err, "listing steps")
		return
	}
	out := struct {
		Steps []storage.StepSummary `json:"steps"`
		Next  string                `json:"next,omitempty"`
	}{Steps: steps}
	if out.Steps == nil {
		out.Steps = []storage.StepSummary{}
	}
	if more {
		last := steps[len(steps)-1]
		at := "n" // a step without a creation time: those come first
		if last.CreatedAt != nil {
			at = strconv.FormatInt(last.CreatedAt.UnixMicro(), 10)
		}
		out.Next = encodeCursor(at + "." + strconv.FormatInt(last.StepID, 10))
	}
	writeJSON(w, http.StatusOK, out)
}

// stepOutstanding answers GET /v1/steps/{step_id}/outstanding: the
// enrollments that have not finished the step, in id order.
func (s *Server) stepOutstanding(w http.ResponseWriter, r *http.Request) {
	id, ok := stepIDParam(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	limit, err := pageLimit(q.Get("limit"))
	if err != nil {
		respondError(w, r, err, "listing outstanding enrollments")
		return
	}
	var after string
	if v := q.Get("after"); v != "" {
		b, err := base64.RawURLEncoding.DecodeString(v)
		if err != nil || len(b) < 2 || b[0] != 'e' {
			writeError(w, r, http.StatusBadRequest, "after: not a cursor this server returned as next")
			return
		}
		after = string(b[1:])
	}
	ids, more, err := s.cfg.Store.StepOutstanding(r.Context(), id, after, limit)
	if err != nil {
		respondError(w, r, err, "listing outstanding enrollments")
		return
	}
	out := struct {
		IDs  []string `json:"ids"`
		Next string   `json:"next,omitempty"`
	}{IDs: ids}
	if out.IDs == nil {
		out.IDs = []string{}
	}
	if more {
		out.Next = base64.RawURLEncoding.EncodeToString([]byte("e" + ids[len(ids)-1]))
	}
	writeJSON(w, http.StatusOK, out)
}

// cancelStep answers DELETE /v1/steps/{step_id}: the step cancelled for
// every enrollment still holding it. No event is written for a cancel.
func (s *Server) cancelStep(w http.ResponseWriter, r *http.Request) {
	id, ok := stepIDParam(w, r)
	if !ok {
		return
	}
	n, err := s.cfg.Store.CancelStep(r.Context(), id)
	if err != nil {
		respondError(w, r, err, "cancelling the step")
		return
	}
	zerolog.Ctx(r.Context()).Info().Int64(logkeys.StepID, id).Int(logkeys.Count, n).Msg("step cancelled for every enrollment")
	w.WriteHeader(http.StatusNoContent)
}

// cancelWorkflowInstance answers DELETE /v1/steps?workflow_name=&instance_id=.
func (s *Server) cancelWorkflowInstance(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	wf, inst := q.Get("workflow_name"), q.Get("instance_id")
	switch {
	case wf == "":
		writeError(w, r, http.StatusBadRequest, "workflow_name: missing (DELETE /v1/steps needs workflow_name and instance_id)")
		return
	case inst == "":
		writeError(w, r, http.StatusBadRequest, "instance_id: missing (DELETE /v1/steps needs workflow_name and instance_id)")
		return
	}
	n, err := s.cfg.Store.CancelWorkflowInstance(r.Context(), wf, inst)
	if err != nil {
		respondError(w, r, err, "cancelling the workflow instance")
		return
	}
	zerolog.Ctx(r.Context()).Info().Str(logkeys.WorkflowName, wf).Str(logkeys.InstanceID, inst).Int(logkeys.Count, n).Msg("workflow instance cancelled")
	writeJSON(w, http.StatusOK, map[string]int{"cancelled_steps": n})
}

// VersionHandler answers GET /version as NanoMDM and NanoCMD do.
func VersionHandler(w http.ResponseWriter, _ *http.Request) {
	v := version.Get()
	writeJSON(w, http.StatusOK, map[string]string{"version": v.Version, "commit": v.Commit})
}

// stepIDParam reads the path's step id: digits only, so that one step has
// one path ("+1" and "01" are not step 1).
func stepIDParam(w http.ResponseWriter, r *http.Request) (int64, bool) {
	v := r.PathValue("step_id")
	id, err := strconv.ParseInt(v, 10, 64)
	if err != nil || id < 1 || v != strconv.FormatInt(id, 10) {
		writeError(w, r, http.StatusBadRequest, fmt.Sprintf("step_id: %q is not a step id", oneLine(v)))
		return 0, false
	}
	return id, true
}

// pageLimit reads an operator listing's limit: DefaultPageLimit without
// one, at most MaxPageLimit.
func pageLimit(v string) (int, error) {
	if v == "" {
		return DefaultPageLimit, nil
	}
	n, err := strconv.Atoi(v)
	switch {
	case err != nil || n < 1:
		return 0, invalid(fmt.Sprintf("limit: %q is not a whole number from 1 to %d", oneLine(v), MaxPageLimit))
	case n > MaxPageLimit:
		return 0, invalid(fmt.Sprintf("limit: %d is over %d, the most one page holds (follow next for more)", n, MaxPageLimit))
	}
	return n, nil
}

// A steps cursor is "s" and "<created_at in µs>.<step id>", base64url:
// opaque to clients, so its form can change.
func encodeCursor(v string) string { return base64.RawURLEncoding.EncodeToString([]byte("s" + v)) }

func decodeStepCursor(v string) (*storage.StepCursor, error) {
	bad := invalid("after: not a cursor this server returned as next")
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil || len(b) < 2 || b[0] != 's' {
		return nil, bad
	}
	us, id, ok := strings.Cut(string(b[1:]), ".")
	if !ok {
		return nil, bad
	}
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n < 1 {
		return nil, bad
	}
	if us == "n" {
		return &storage.StepCursor{ID: n}, nil
	}
	t, err := strconv.ParseInt(us, 10, 64)
	if err != nil || t < 0 {
		return nil, bad
	}
	at := time.UnixMicro(t).UTC()
	return &storage.StepCursor{CreatedAt: &at, ID: n}, nil
}
