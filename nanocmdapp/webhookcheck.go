package nanocmdapp

import (
	"encoding/json"
	"errors"
	"strings"

	"github.com/micromdm/nanocmd/mdm"
)

// webhookEvent is what NanoCMD's webhook handler needs of a body.
type webhookEvent struct {
	Topic string       `json:"topic"`
	Ack   *webhookPart `json:"acknowledge_event"`
	Check *webhookPart `json:"checkin_event"`
}

type webhookPart struct {
	UDID         string `json:"udid"`
	EnrollmentID string `json:"enrollment_id"`
	Status       string `json:"status"`
	CommandUUID  string `json:"command_uuid"`
	RawPayload   []byte `json:"raw_payload"`
}

// errIgnoredTopic is a topic NanoCMD has no use for (NanoMDM sends every
// check-in's): answered 200 without its handler, which would answer 500.
var errIgnoredTopic = errors.New("topic not used by NanoCMD")

// checkWebhookEvent says what a webhook body lacks that NanoCMD's handler
// would answer 500 for (a client's mistake), naming the field, or
// errIgnoredTopic. The body is JSON with valid plists (CheckWebhookPlists).
func checkWebhookEvent(body []byte) error {
	var ev webhookEvent
	if err := json.Unmarshal(body, &ev); err != nil {
		return errors.New("body: " + err.Error())
	}
	topic := ev.Topic
	switch {
	case topic == "":
		return errors.New("topic: missing")
	case topic == "mdm.Connect":
		return checkWebhookPart("acknowledge_event", topic, ev.Ack)
	case !strings.HasPrefix(topic, "mdm.") || mdm.NewCheckinFromMessageType(topic[len("mdm."):]) == nil:
		return errIgnoredTopic
	}
	return checkWebhookPart("checkin_event", topic, ev.Check)
}

func checkWebhookPart(field, topic string, p *webhookPart) error {
	switch {
	case p == nil:
		return errors.New(field + ": missing for topic " + topic)
	case p.UDID == "" && p.EnrollmentID == "":
		return errors.New(field + ": no udid or enrollment_id")
	case field == "checkin_event" && len(p.RawPayload) == 0:
		return errors.New(field + ".raw_payload: missing")
	case field == "acknowledge_event" && p.Status != "Idle" && p.CommandUUID == "":
		return errors.New(field + ".command_uuid: missing")
	}
	return nil
}
