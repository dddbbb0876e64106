package httpapi

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/micromdm/plist"

	"github.com/stepcollect/stepcollect/storage"
)

// Action is what a webhook event asks of stepcollect.
type Action int

const (
	// Ignore: nothing to do (an Idle report, a topic we do not act on).
	Ignore Action = iota
	// CommitResult: store a command result for an enrollment.
	CommitResult
	// CancelEnrollment: the device re-enrolled or left; cancel its steps.
	CancelEnrollment
)

// WebhookEvent is a NanoMDM webhook event, decoded and decided.
type WebhookEvent struct {
	Action       Action
	Reason       string // why it is ignored
	Topic        string
	EventID      string
	EnrollmentID string // udid, or enrollment_id where udid is empty (NanoCMD's rule)
	CommandUUID  string
	Status       string // from the result plist
	Raw          []byte // the decoded raw_payload
}

// Completed reports whether a result completes its command: every status
// but NotNow does (Acknowledged, Error, CommandFormatError).
func (e *WebhookEvent) Completed() bool { return e.Status != "NotNow" }

// The JSON NanoMDM v0.9 sends (service/webhook). Unknown fields are
// allowed: NanoMDM adds some (ids, token_update_tally) we do not need.
type wireEvent struct {
	Topic            string       `json:"topic"`
	EventID          string       `json:"event_id"`
	AcknowledgeEvent *wirePayload `json:"acknowledge_event"`
	CheckinEvent     *wirePayload `json:"checkin_event"`
}

type wirePayload struct {
	UDID         string  `json:"udid"`
	EnrollmentID string  `json:"enrollment_id"`
	Status       string  `json:"status"`
	CommandUUID  string  `json:"command_uuid"`
	RawPayload   *string `json:"raw_payload"`
}

// resultPlist is what is read from a command result's plist.
type resultPlist struct {
	Status      string
	CommandUUID string
}

// DecodeWebhook decodes one webhook body and decides what it asks for. Every
// error is a storage.EInvalid *storage.Error whose one-line message names
// the field at fault.
func DecodeWebhook(body []byte) (*WebhookEvent, error) {
	var w wireEvent
	if err := json.Unmarshal(body, &w); err != nil {
		return nil, invalid(jsonProblem(err))
	}
	ev := &WebhookEvent{Topic: w.Topic, EventID: w.EventID}
	switch w.Topic {
	case "":
		return nil, invalid("topic: missing")
	case "mdm.Connect":
		return decodeResult(ev, w.AcknowledgeEvent)
	case "mdm.Authenticate", "mdm.CheckOut":
		return decodeCheckin(ev, w.CheckinEvent)
	default:
		ev.Action, ev.Reason = Ignore, "topic "+oneLine(w.Topic)+" is not acted on"
		return ev, nil
	}
}

func decodeResult(ev *WebhookEvent, p *wirePayload) (*WebhookEvent, error) {
	const field = "acknowledge_event"
	if p == nil {
		return nil, invalid(field + ": missing for topic mdm.Connect")
	}
	raw, err := rawPayload(field, p.RawPayload)
	if err != nil {
		return nil, err
	}
	var r resultPlist
	if err := plist.Unmarshal(raw, &r); err != nil {
		return nil, invalid(field + ".raw_payload: not a plist: " + oneLine(err.Error()))
	}
	ev.Raw, ev.Status = raw, r.Status
	if ev.Status == "" {
		return nil, invalid(field + ".raw_payload: the result plist has no Status")
	}
	if ev.Status == "Idle" {
		ev.Action, ev.Reason = Ignore, "Idle status"
		return ev, nil
	}
	ev.EnrollmentID = enrollmentID(p)
	if ev.EnrollmentID == "" {
		return nil, invalid(field + ": no udid or enrollment_id")
	}
	ev.CommandUUID = p.CommandUUID
	if ev.CommandUUID == "" {
		ev.CommandUUID = r.CommandUUID
	}
	if ev.CommandUUID == "" {
		return nil, invalid(field + ".command_uuid: missing (and none in the result plist)")
	}
	ev.Action = CommitResult
	return ev, nil
}

func decodeCheckin(ev *WebhookEvent, p *wirePayload) (*WebhookEvent, error) {
	const field = "checkin_event"
	if p == nil {
		return nil, invalid(field + ": missing for topic " + ev.Topic)
	}
	raw, err := rawPayload(field, p.RawPayload)
	if err != nil {
		return nil, err
	}
	var msg struct{ MessageType string }
	if err := plist.Unmarshal(raw, &msg); err != nil {
		return nil, invalid(field + ".raw_payload: not a plist: " + oneLine(err.Error()))
	}
	ev.Raw = raw
	ev.EnrollmentID = enrollmentID(p)
	if ev.EnrollmentID == "" {
		return nil, invalid(field + ": no udid or enrollment_id")
	}
	ev.Action = CancelEnrollment
	return ev, nil
}

// enrollmentID is NanoCMD's rule, so steps NanoCMD made match.
func enrollmentID(p *wirePayload) string {
	if p.UDID != "" {
		return p.UDID
	}
	return p.EnrollmentID
}

func rawPayload(field string, s *string) ([]byte, error) {
	if s == nil || *s == "" {
		return nil, invalid(field + ".raw_payload: missing")
	}
	raw, err := base64.StdEncoding.DecodeString(*s)
	if err != nil {
		return nil, invalid(field + ".raw_payload: not standard base64: " + err.Error())
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, invalid(field + ".raw_payload: empty")
	}
	return raw, nil
}

// jsonProblem says in one line what is wrong with a body that did not
// decode, naming the field where the decoder knows it.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typ) && typ.Field != "":
		return fmt.Sprintf("%s: want %s, got a JSON %s", typ.Field, typ.Type, typ.Value)
	case errors.As(err, &typ):
		return fmt.Sprintf("body: want a JSON object, got a JSON %s", typ.Value)
	case errors.As(err, &syn):
		return fmt.Sprintf("body: not JSON: %s (at byte %d)", syn.Error(), syn.Offset)
	}
	return "body: not JSON: " + oneLine(err.Error())
}

func invalid(msg string) error { return &storage.Error{Code: storage.EInvalid, Message: msg} }

// oneLine keeps messages (which may quote input) on one line and bounded.
func oneLine(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\n' || r == '\r' || r < 0x20 {
			return ' '
		}
		return r
	}, s)
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}
