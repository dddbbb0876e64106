package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
)

// RefuseBrowserWebhook says why r, a POST to an MDM webhook, is refused as
// a browser's: an Origin header, or Sec-Fetch-Site other than same-origin or
// none. NanoMDM sends neither; a cross-site form POST (text/plain, no
// preflight) would otherwise be taken as a device's result.
func RefuseBrowserWebhook(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("refused: a browser's request from another origin (Sec-Fetch-Site: %s); the webhook takes the MDM server's POSTs, which carry neither Origin nor Sec-Fetch-Site", strconv.Quote(oneLine(site)))
	}
	if origin, ok := r.Header["Origin"]; ok {
		return fmt.Errorf("refused: a browser's request (Origin: %s); the webhook takes the MDM server's POSTs, which carry no Origin", strconv.Quote(oneLine(strings.Join(origin, ", "))))
	}
	return nil
}

// browserless refuses a browser's POST (RefuseBrowserWebhook) with a 403,
// before its body is read.
func (s *Server) browserless(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := RefuseBrowserWebhook(r); err != nil {
			s.result(metrics.OutcomeRejected)
			writeError(w, r, http.StatusForbidden, err.Error())
			return
		}
		next(w, r)
	}
}

// webhook takes NanoMDM's webhook. NanoMDM posts each result once and never
// again, and only logs a non-200: so a 200 means committed, and nothing but
// a failure to commit answers anything else. Redis is never a reason for a
// non-200: the follow-up work goes to the queue after the commit, and the
// sweeper finds it if the queue cannot take it.
func (s *Server) webhook(w http.ResponseWriter, r *http.Request, body []byte, err error) {
	if s.cfg.DumpWebhook != nil && err == nil {
		s.dump(body)
	}
	if err != nil {
		s.result(metrics.OutcomeRejected)
		respondError(w, r, err, "reading the webhook body")
		return
	}
	if len(s.cfg.WebhookHMACKey) > 0 && !validHMAC(s.cfg.WebhookHMACKey, body, r.Header.Get("X-Hmac-Signature")) {
		s.result(metrics.OutcomeRejected)
		writeError(w, r, http.StatusUnauthorized, "X-Hmac-Signature: missing or wrong (standard base64 of HMAC-SHA256 over the body)")
		return
	}
	ev, err := DecodeWebhook(body)
	if err != nil {
		s.result(metrics.OutcomeRejected)
		respondError(w, r, err, "decoding the webhook")
		return
	}
	ctx := r.Context()
	logger := zerolog.Ctx(ctx).With().Str(logkeys.Topic, ev.Topic).Str(logkeys.EventID, ev.EventID).
		Str(logkeys.EnrollmentID, ev.EnrollmentID).Str(logkeys.CommandUUID, ev.CommandUUID).Logger()
	ctx = logger.WithContext(ctx)
	r = r.WithContext(ctx)

	switch ev.Action {
	case Ignore:
		s.result(metrics.OutcomeIgnored)
		logger.Debug().Str(logkeys.Reason, ev.Reason).Msg("webhook ignored")

	case CancelEnrollment:
		if err := s.cfg.Store.CancelSteps(ctx, ev.EnrollmentID, ""); err != nil {
			s.result(metrics.OutcomeError)
			respondError(w, r, err, "cancelling the enrollment's steps")
			return
		}
		logger.Info().Msg("enrollment re-enrolled or left: its steps are cancelled")

	case CommitResult:
		res, err := s.cfg.Store.StoreCommandResponseAndRetrieveCompletedStep(ctx, ev.EnrollmentID, &nanostorage.StepCommandResult{
			CommandUUID: ev.CommandUUID, ResultReport: ev.Raw, Completed: ev.Completed(),
		})
		switch {
		case errors.Is(err, storage.ErrUnknownCommand):
			// Not sent by a workflow, its step already finished or was
			// cancelled, or stored only after its command was enqueued in
			// NanoMDM: then the step waits for an answer that already came.
			s.result(metrics.OutcomeIgnored)
			if s.cfg.Metrics != nil {
				s.cfg.Metrics.UnknownCommandResults.Inc()
			}
			logger.Warn().Msg("result for a command no step holds: ignored (not sent by a workflow, its step finished or was cancelled, a result sent again after it was committed, or a step stored only after its command was enqueued in NanoMDM)")
		case err != nil:
			if statusOf(err) < 500 {
				s.result(metrics.OutcomeRejected) // the input's fault (too large, refused value)
			} else {
				s.result(metrics.OutcomeError)
			}
			respondError(w, r, err, "committing the result")
			return
		case !ev.Completed():
			s.result(metrics.OutcomeNotNow)
		case res != nil:
			s.result(metrics.OutcomeCompletedStep)
			logger.Debug().Str(logkeys.WorkflowName, res.WorkflowName).Str(logkeys.InstanceID, res.InstanceID).Msg("step completed for this enrollment")
		default:
			s.result(metrics.OutcomeStored)
		}
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) result(outcome string) {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Results.WithLabelValues(outcome).Inc()
	}
}

// dump writes body and a newline to DumpWebhook; NanoMDM's bodies are one
// line of JSON, so the output is one webhook per line.
func (s *Server) dump(body []byte) {
	s.dumpMu.Lock()
	defer s.dumpMu.Unlock()
	s.cfg.DumpWebhook.Write(body)
	if len(body) == 0 || body[len(body)-1] != '\n' {
		s.cfg.DumpWebhook.Write([]byte{'\n'})
	}
}
