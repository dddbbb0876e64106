package nanomdm

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/micromdm/nanomdm/service/webhook"
)

// Webhook records what NanoMDM posts to its -webhook-url: check-ins, and
// command reports (topic mdm.Connect). Idle reports are only counted.
type Webhook struct {
	URL string

	t       testing.TB
	hmacKey []byte
	mu      sync.Mutex
	events  []webhook.EventJson
	acks    []Ack
	idle    int
}

// Ack is a command report NanoMDM posted.
type Ack struct {
	UDID        string
	CommandUUID string
	Status      string
	Raw         []byte // the device's report, decoded from base64
}

// NewWebhook starts a recorder for t. With hmacKey it checks each post's
// X-Hmac-Signature and fails t (answering 401) on a wrong one.
func NewWebhook(t testing.TB, hmacKey string) *Webhook {
	w := &Webhook{t: t, hmacKey: []byte(hmacKey)}
	srv := httptest.NewServer(http.HandlerFunc(w.serve))
	t.Cleanup(srv.Close)
	w.URL = srv.URL
	return w
}

func (w *Webhook) serve(rw http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	if len(w.hmacKey) > 0 {
		mac := hmac.New(sha256.New, w.hmacKey)
		mac.Write(body)
		if got := r.Header.Get(webhook.HMACHeader); got != base64.StdEncoding.EncodeToString(mac.Sum(nil)) {
			w.t.Errorf("webhook post with a wrong %s %q: %s", webhook.HMACHeader, got, body)
			http.Error(rw, "bad signature", http.StatusUnauthorized)
			return
		}
	}
	var ev webhook.EventJson
	if err := json.Unmarshal(body, &ev); err != nil {
		w.t.Errorf("webhook post is not an event: %v: %s", err, body)
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if a := ev.AcknowledgeEvent; a != nil {
		if ev.Topic != webhook.EventJsonTopicMdmConnect {
			w.t.Errorf("webhook post of a command report with topic %q, want %q: %s", ev.Topic, webhook.EventJsonTopicMdmConnect, body)
		}
		if a.Status == "Idle" {
			w.idle++
			return
		}
		raw, err := base64.StdEncoding.DecodeString(string(a.RawPayload))
		if err != nil {
			w.t.Errorf("webhook raw_payload is not base64: %v: %s", err, body)
		}
		ack := Ack{Status: a.Status, Raw: raw}
		if a.Udid != nil {
			ack.UDID = string(*a.Udid)
		}
		if a.CommandUuid != nil {
			ack.CommandUUID = *a.CommandUuid
		}
		w.acks = append(w.acks, ack)
	}
	w.events = append(w.events, ev)
}

// Events are the posts so far but Idle reports, in the order they came.
func (w *Webhook) Events() []webhook.EventJson {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]webhook.EventJson(nil), w.events...)
}

// Topics counts the posts so far by topic (Idle reports left out).
func (w *Webhook) Topics() map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]int{}
	for _, ev := range w.events {
		out[string(ev.Topic)]++
	}
	return out
}

// Acks are the command reports so far but Idle ones.
func (w *Webhook) Acks() []Ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]Ack(nil), w.acks...)
}

// AcksOf are the reports of command uuid so far, by UDID, in order.
func (w *Webhook) AcksOf(uuid string) map[string][]Ack {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string][]Ack{}
	for _, a := range w.acks {
		if a.CommandUUID == uuid {
			out[a.UDID] = append(out[a.UDID], a)
		}
	}
	return out
}

// Idle is how many Idle reports were posted.
func (w *Webhook) Idle() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.idle
}
