// Package delivery delivers the outbox's events to the workflow engine:
// POST to the callback URL, signed, at least once. The Dispatcher polls the
// outbox, which decides who delivers (a lease per event). A 2xx
// acknowledges and removes the event; anything else is tried again after a
// backoff, for as long as it takes. Nothing is archived, and nothing is
// lost. Nothing here touches the queue: the outbox in MySQL is the only
// source of events, so delivery works with Redis down.
package delivery

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
)

// Headers of a callback.
const (
	EventIDHeader   = "X-Stepcollect-Event-Id"
	SignatureHeader = "X-Stepcollect-Signature"
)

// Config configures a Deliverer.
type Config struct {
	// URL receives the events. Empty: events wait in the outbox.
	URL string
	// HMACKey, when set, signs each body (SignatureHeader).
	HMACKey []byte
	// Timeout bounds one attempt. Default 30s.
	Timeout time.Duration
}

// Deliverer makes one signed POST of one event; the Dispatcher decides
// which events, and what an answer does to them.
type Deliverer struct {
	cfg     Config
	client  *http.Client
	metrics *metrics.Delivery
	logger  zerolog.Logger
}

// New returns a Deliverer.
func New(cfg Config, m *metrics.Delivery, logger zerolog.Logger) *Deliverer {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	return &Deliverer{cfg: cfg, metrics: m, logger: logger,
		client: &http.Client{Timeout: cfg.Timeout, CheckRedirect: noRedirects, Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
			DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		}}}
}

// keepOpen sizes the connections to the receiver for n POSTs at once: all
// n stay open between POSTs, and no more are opened. An idle pool smaller
// than the POSTs in flight closes the rest as each round of batches ends,
// and the next round dials them again: a TCP handshake, and a TLS one to
// an https receiver, per event on both sides (measured: 14% of a worker's
// CPU went to dialling). Only grows, so a Deliverer shared by dispatchers
// keeps what the largest needs.
func (d *Deliverer) keepOpen(n int) {
	t := d.client.Transport.(*http.Transport)
	t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, n)
	t.MaxConnsPerHost = max(t.MaxConnsPerHost, n)
}

// Sign is the signature of body under key: standard base64 of
// HMAC-SHA256, as a receiver recomputes it.
func Sign(key, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// post sends one attempt and classifies its outcome. Its error names the
// callback URL with its user information redacted: it is logged and kept
// as the event's last_error.
func (d *Deliverer) post(ctx context.Context, ev *storage.OutboxEvent) (string, error) {
	outcome, err := d.try(ctx, ev)
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = config.RedactURL(ue.URL) // net/http masks the password only
	}
	return outcome, config.RedactError(err, d.cfg.URL)
}

func (d *Deliverer) try(ctx context.Context, ev *storage.OutboxEvent) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.cfg.URL, bytes.NewReader(ev.Payload))
	if err != nil {
		return metrics.DeliveryHTTPError, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(EventIDHeader, ev.EventID)
	req.Header.Set("User-Agent", "stepcollect")
	if len(d.cfg.HMACKey) > 0 {
		req.Header.Set(SignatureHeader, Sign(d.cfg.HMACKey, ev.Payload))
	}
	resp, err := d.client.Do(req)
	if err != nil {
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout()) {
			return metrics.DeliveryTimeout, fmt.Errorf("no answer within %v", d.cfg.Timeout)
		}
		return metrics.DeliveryHTTPError, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode >= 300 && resp.StatusCode <= 399 {
		return metrics.DeliveryHTTPError, &statusError{resp.StatusCode, fmt.Sprintf("callback answered %s with Location %q: redirects are not followed (point -callback-url at the final URL)", resp.Status, config.RedactURL(resp.Header.Get("Location")))}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return metrics.DeliveryHTTPError, &statusError{resp.StatusCode, "callback answered " + resp.Status}
	}
	return metrics.DeliveryOK, nil
}

// statusError is a POST the receiver answered with a status other than 2xx.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

// judged says whether err is the receiver's answer about the event itself:
// a 4xx but those that refuse any request alike (401, 403 and 407: its
// credentials; 408 and 429: the receiver's load). A receiver that judges
// an event is up, whatever it thinks of that one; one that does not
// answer, fails (5xx), redirects, or refuses every request is not taking
// events.
func judged(err error) bool {
	var se *statusError
	if !errors.As(err, &se) || se.code < 400 || se.code > 499 {
		return false
	}
	switch se.code {
	case http.StatusUnauthorized, http.StatusForbidden, http.StatusProxyAuthRequired,
		http.StatusRequestTimeout, http.StatusTooManyRequests:
		return false
	}
	return true
}

// noRedirects keeps the client on the callback URL. Following a redirect
// would turn the POST into a GET (301, 302, 303) whose 2xx says nothing
// about the event: it would be acknowledged and deleted with no receiver
// having seen its body. A 3xx is a failed delivery instead.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
