// Package delivery delivers the outbox's events to the workflow engine:
// POST to the callback URL, signed, at least once. The Dispatcher polls the
// outbox, which decides who delivers (a lease per event). A 2xx
// acknowledges and removes the event; anything else is tried again after a
// backoff, for as long as it takes. Nothing is archived, and nothing is
// lost. The Deliverer is also the asynq handler of the per-event deliver
// tasks older builds enqueued.
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

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/tasks"
)

// Headers of a callback.
const (
	EventIDHeader   = "X-Stepcollect-Event-Id"
	SignatureHeader = "X-Stepcollect-Signature"
)

// Store is what delivery needs of the storage.
type Store interface {
	ClaimEvent(ctx context.Context, id int64, lease time.Duration) (*storage.OutboxEvent, error)
	AckEvent(ctx context.Context, id int64) error
	FailEvent(ctx context.Context, id int64, reason string, retryAt time.Time) error
}

// Config configures a Deliverer.
type Config struct {
	// URL receives the events. Empty: events wait in the outbox.
	URL string
	// HMACKey, when set, signs each body (SignatureHeader).
	HMACKey []byte
	// Timeout bounds one attempt. Default 30s.
	Timeout time.Duration
}

// Deliverer is the asynq handler of delivery tasks.
type Deliverer struct {
	cfg     Config
	store   Store
	client  *http.Client
	metrics *metrics.Delivery
	logger  zerolog.Logger
}

// New returns a Deliverer.
func New(cfg Config, store Store, m *metrics.Delivery, logger zerolog.Logger) *Deliverer {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	return &Deliverer{cfg: cfg, store: store, metrics: m, logger: logger,
		client: &http.Client{Timeout: cfg.Timeout, CheckRedirect: noRedirects, Transport: &http.Transport{
			Proxy: http.ProxyFromEnvironment, MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
			DialContext: (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		}}}
}

// Sign is the signature of body under key: standard base64 of
// HMAC-SHA256, as a receiver recomputes it.
func Sign(key, body []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write(body)
	return base64.StdEncoding.EncodeToString(mac.Sum(nil))
}

// ProcessTask implements asynq.Handler.
func (d *Deliverer) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := tasks.ParseDeliver(t)
	if err != nil {
		d.logger.Error().Err(err).Msg("unreadable delivery task")
		return err
	}
	if d.cfg.URL == "" {
		return nil // no receiver configured: the event waits in the outbox
	}
	logger := d.logger.With().Int64(logkeys.OutboxID, p.Event.ID).Str(logkeys.EventID, p.Event.EventID).Str(logkeys.EventType, p.Event.Type).Logger()
	// the lease covers this attempt; a failure below resets it
	ev, err := d.store.ClaimEvent(ctx, p.Event.ID, d.cfg.Timeout+15*time.Second)
	if errors.Is(err, storage.ErrEventNotClaimable) {
		logger.Debug().Msg("event delivered already, or being delivered elsewhere")
		return nil
	} else if err != nil {
		return fmt.Errorf("claiming event %d: %w", p.Event.ID, err)
	}

	outcome, err := d.post(ctx, ev)
	d.metrics.Deliveries.WithLabelValues(ev.Type, outcome).Inc()
	if err == nil {
		if err := d.store.AckEvent(ctx, ev.ID); err != nil {
			// delivered but not removed: it will be delivered again, which
			// the receiver's dedup on event_id absorbs
			return fmt.Errorf("removing delivered event %s: %w", ev.EventID, err)
		}
		logger.Debug().Int(logkeys.Attempt, ev.Attempts).Msg("event delivered")
		return nil
	}

	// The dispatcher owns retries: it offers the event again once this
	// short lease lapses, with its own backoff. asynq is not asked to.
	retryAt := time.Now().Add(time.Second)
	if ferr := d.store.FailEvent(ctx, ev.ID, err.Error(), retryAt); ferr != nil {
		logger.Warn().Err(ferr).Msg("recording the failed delivery")
	}
	logger.Warn().Err(err).Int(logkeys.Attempt, ev.Attempts).Msg("delivery failed; the dispatcher tries again")
	return nil
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
		return metrics.DeliveryHTTPError, fmt.Errorf("callback answered %s with Location %q: redirects are not followed (point -callback-url at the final URL)", resp.Status, config.RedactURL(resp.Header.Get("Location")))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return metrics.DeliveryHTTPError, fmt.Errorf("callback answered %s", resp.Status)
	}
	return metrics.DeliveryOK, nil
}

// noRedirects keeps the client on the callback URL. Following a redirect
// would turn the POST into a GET (301, 302, 303) whose 2xx says nothing
// about the event: it would be acknowledged and deleted with no receiver
// having seen its body. A 3xx is a failed delivery instead.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
