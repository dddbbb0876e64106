package httpapi

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
	"github.com/stepcollect/stepcollect/internal/mdmplist"
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
	UDID         string      `json:"udid"`
	EnrollmentID string      `json:"enrollment_id"`
	Status       string      `json:"status"`
	CommandUUID  string      `json:"command_uuid"`
	RawPayload   base64Field `json:"raw_payload"`
}

// base64Field is a JSON string of standard base64, decoded straight from
// the body: the payload (up to the body limit) is not first copied into a
// string. A base64 error is kept for rawPayload to report with the field's
// name, as it did when the field was a string.
type base64Field struct {
	raw     []byte
	present bool // a non-empty string
	err     error
}

var stringType = reflect.TypeFor[string]()

func (f *base64Field) UnmarshalJSON(data []byte) error {
	switch data[0] {
	case 'n':
		return nil // null: missing
	case '"':
	default:
		// what encoding/json says of a string field given another type; it
		// adds the field's name
		kind := "number"
		switch data[0] {
		case '{':
			kind = "object"
		case '[':
			kind = "array"
		case 't', 'f':
			kind = "bool"
		}
		return &json.UnmarshalTypeError{Value: kind, Type: stringType}
	}
	text := data[1 : len(data)-1]
	if bytes.IndexByte(text, '\\') >= 0 { // escapes (never in base64 from NanoMDM): unquote first
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		text = []byte(s)
	}
	if f.present = len(text) > 0; !f.present {
		return nil
	}
	f.raw = make([]byte, base64.StdEncoding.DecodedLen(len(text)))
	n, err := base64.StdEncoding.Decode(f.raw, text)
	f.raw, f.err = f.raw[:n], err
	return nil
}

// The plist keys read; the rest of a plist is checked, not decoded.
const (
	keyStatus      = "Status"
	keyCommandUUID = "CommandUUID"
	keyMessageType = "MessageType"
)

// DecodeWebhook decodes one webhook body and decides what it asks for. Every
// error is a storage.EInvalid *storage.Error whose one-line message names
// the field at fault.
func DecodeWebhook(body []byte) (*WebhookEvent, error) {
	if err := checkUTF8(body); err != nil {
		return nil, err
	}
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

// CheckWebhookPlists checks, for a handler that decodes a NanoMDM webhook
// body itself (cmd/nanocmd: NanoCMD's, whose plist decoder a hostile
// plist stops with a fatal stack overflow or out-of-memory), that the body
// is JSON and that every raw_payload it carries, of any topic, is standard
// base64 of one plist within mdmplist.DefaultLimits. An error is a
// storage.EInvalid naming the field, in one line.
func CheckWebhookPlists(body []byte) error {
	if err := checkUTF8(body); err != nil {
		return err
	}
	var w wireEvent
	if err := json.Unmarshal(body, &w); err != nil {
		return invalid(jsonProblem(err))
	}
	for _, e := range []struct {
		field string
		p     *wirePayload
	}{{"acknowledge_event", w.AcknowledgeEvent}, {"checkin_event", w.CheckinEvent}} {
		if e.p == nil || !e.p.RawPayload.present {
			continue // whether one is needed is the handler's to say
		}
		raw, err := rawPayload(e.field, e.p.RawPayload)
		if err != nil {
			return err
		}
		// the keys the api reads must be strings, once, here too
		if _, err := mdmplist.TopLevelStrings(raw, mdmplist.DefaultLimits, keyStatus, keyCommandUUID, keyMessageType); err != nil {
			return invalid(e.field + ".raw_payload: not a plist: " + oneLine(err.Error()))
		}
	}
	return nil
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
	r, err := mdmplist.TopLevelStrings(raw, mdmplist.DefaultLimits, keyStatus, keyCommandUUID)
	if err != nil {
		return nil, invalid(field + ".raw_payload: not a plist: " + oneLine(err.Error()))
	}
	ev.Raw, ev.Status = raw, r[keyStatus]
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
		ev.CommandUUID = r[keyCommandUUID]
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
	if _, err := mdmplist.TopLevelStrings(raw, mdmplist.DefaultLimits, keyMessageType); err != nil {
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

func rawPayload(field string, f base64Field) ([]byte, error) {
	if !f.present {
		return nil, invalid(field + ".raw_payload: missing")
	}
	if f.err != nil {
		return nil, invalid(field + ".raw_payload: not standard base64: " + f.err.Error())
	}
	raw := f.raw
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, invalid(field + ".raw_payload: empty")
	}
	return raw, nil
}

// jsonKind names what a Go type is read from, in JSON's words: a caller
// knows objects and arrays, not the server's type names.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "another value"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "an array"
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

// jsonProblem says in one line what is wrong with a body that did not
// decode, naming the field where the decoder knows it.
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &typ) && typ.Field != "":
		return fmt.Sprintf("%s: want %s, got a JSON %s", typ.Field, jsonKind(typ.Type), typ.Value)
	case errors.As(err, &typ):
		return fmt.Sprintf("body: want a JSON object, got a JSON %s", typ.Value)
	case errors.As(err, &syn):
		return fmt.Sprintf("body: not JSON: %s (at byte %d)", syn.Error(), syn.Offset)
	}
	return "body: not JSON: " + oneLine(err.Error())
}

// checkUTF8 refuses a JSON body that is not UTF-8, naming the first byte
// that is not. encoding/json would take each such byte for U+FFFD, so an
// id sent that way would be stored, or looked up, as another id than the
// one the client holds.
func checkUTF8(body []byte) error {
	if utf8.Valid(body) {
		return nil
	}
	for i := 0; i < len(body); {
		r, n := utf8.DecodeRune(body[i:])
		if r == utf8.RuneError && n == 1 {
			return invalid(fmt.Sprintf("body: not UTF-8 at byte %d (0x%02x); JSON must be UTF-8", i, body[i]))
		}
		i += n
	}
	return nil
}

// checkSurrogates refuses a \u escape of half a UTF-16 surrogate pair,
// naming the field that holds it: encoding/json takes it for U+FFFD, so
// an id sent that way would be stored as another id than the client's.
func checkSurrogates(body []byte) error {
	for i := 0; ; {
		j := bytes.IndexByte(body[i:], '\\')
		if j < 0 || i+j+1 >= len(body) {
			return nil
		}
		at := i + j
		if body[at+1] != 'u' {
			i = at + 2 // an escape of one character: \\ is not the start of \u
			continue
		}
		r, ok := hex4(body[at+2:])
		switch {
		case !ok || !utf16.IsSurrogate(r):
		case r < 0xdc00 && len(body) >= at+12 && body[at+6] == '\\' && body[at+7] == 'u':
			if r2, ok := hex4(body[at+8:]); ok && r2 >= 0xdc00 && r2 <= 0xdfff {
				i = at + 12 // a whole pair
				continue
			}
			fallthrough
		default:
			return invalid(fmt.Sprintf("%s: %s at byte %d is half a UTF-16 surrogate pair, not a character", oneLine(jsonPath(body, at)), body[at:at+6], at))
		}
		i = at + 2
	}
}

// hex4 reads the four hex digits of a \u escape.
func hex4(b []byte) (rune, bool) {
	if len(b) < 4 {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[:4]), 16, 16)
	return rune(n), err == nil
}

// jsonPath names the value of body in which byte off lies, as
// "commands[1].command_uuid", or "body" at the top or when body is not JSON.
func jsonPath(body []byte, off int) string {
	type level struct {
		array  bool
		index  int    // an array's current element
		key    string // an object's current key
		hasKey bool   // the key is read, its value comes next
	}
	var stack []level
	name := func() string {
		var b strings.Builder
		for _, l := range stack {
			switch {
			case l.array:
				fmt.Fprintf(&b, "[%d]", l.index)
			case b.Len() > 0:
				b.WriteString("." + l.key)
			default:
				b.WriteString(l.key)
			}
		}
		return cmp.Or(b.String(), "body")
	}
	valueDone := func() {
		if n := len(stack); n > 0 {
			stack[n-1].index++
			stack[n-1].hasKey = false
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	for {
		tok, err := dec.Token()
		if err != nil {
			return "body"
		}
		top := len(stack) - 1
		inKey := top >= 0 && !stack[top].array && !stack[top].hasKey
		switch tok {
		case json.Delim('{'), json.Delim('['):
			stack = append(stack, level{array: tok == json.Delim('[')})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
			valueDone()
			continue
		}
		if inKey {
			stack[top].key, stack[top].hasKey = tok.(string), true
		}
		if dec.InputOffset() > int64(off) {
			return name()
		}
		if !inKey {
			valueDone()
		}
	}
}

func invalid(msg string) error { return &storage.Error{Code: storage.EInvalid, Message: msg} }

// oneLine keeps messages (which may quote input) on one line and bounded.
var oneLine = bodyadmit.OneLine
