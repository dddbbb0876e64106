package scheduler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/metrics"
)

// PushChunk is how many enrollment ids one push request names: NanoCMD's
// mdm/foss limit, a conservative bound on the length of a request path.
const PushChunk = 30

// pushTimeout bounds each push request, as a callback's.
const pushTimeout = 30 * time.Second

// Pusher sends APNs pushes through NanoMDM's push API as NanoCMD's
// mdm/foss does: GET <push-url><id>,<id>,… with HTTP basic auth, user
// "nanomdm" and the API key as password.
type Pusher struct {
	base    string // ends in "/"
	key     string
	client  *http.Client
	metrics *metrics.RePush
	logger  zerolog.Logger
}

// NewPusher returns a Pusher to pushURL (checked as -push-url is).
func NewPusher(pushURL, apiKey string, m *metrics.RePush, logger zerolog.Logger) *Pusher {
	if !strings.HasSuffix(pushURL, "/") {
		pushURL += "/" // the ids are the path's last segment
	}
	return &Pusher{base: pushURL, key: apiKey, metrics: m, logger: logger, client: &http.Client{
		Timeout: pushTimeout,
		// a redirect is an answer to report, not to follow with the key
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

// CheckPushURL checks -push-url: empty, or an http(s) URL with no query or
// fragment (the ids are appended to its path).
func CheckPushURL(flagName string, u *string) func() error {
	isHTTP := config.HTTPURL(flagName, u)
	return func() error {
		if err := isHTTP(); err != nil || *u == "" {
			return err
		}
		if p, _ := url.Parse(*u); p.RawQuery != "" || p.Fragment != "" || p.ForceQuery {
			return fmt.Errorf("-%s: %q has a query or fragment (the enrollment ids are appended to its path)", flagName, config.RedactURL(*u))
		}
		return nil
	}
}

// Push pushes ids, PushChunk to a request, one after the other, and
// returns how many were acknowledged with a 2xx. A failed request is
// logged and counted; the others still go. Those left when ctx ends (the
// run's time is up, or the worker stops) are counted as errors.
func (p *Pusher) Push(ctx context.Context, ids []string) (ok int) {
	for len(ids) > 0 && ctx.Err() == nil {
		chunk := ids[:min(PushChunk, len(ids))]
		ids = ids[len(chunk):]
		outcome := p.pushChunk(ctx, chunk)
		p.metrics.Pushed(outcome, len(chunk))
		if outcome == metrics.RePushOK {
			ok += len(chunk)
		}
	}
	if len(ids) > 0 {
		p.metrics.Pushed(metrics.RePushError, len(ids))
		p.logger.Warn().Err(ctx.Err()).Int(logkeys.Count, len(ids)).Msg("enrollments not pushed: the run ended first; they are pushed after the next -repush-interval")
	}
	return ok
}

func (p *Pusher) pushChunk(ctx context.Context, ids []string) string {
	log := p.logger.With().Int(logkeys.Count, len(ids)).Str(logkeys.EnrollmentID, ids[0]).Logger()
	escaped := make([]string, len(ids))
	for i, id := range ids {
		escaped[i] = url.PathEscape(id)
	}
	ctx, cancel := context.WithTimeout(ctx, pushTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+strings.Join(escaped, ","), nil)
	if err != nil {
		log.Warn().Err(config.RedactError(err, p.base)).Msg("push request not made")
		return metrics.RePushError
	}
	req.SetBasicAuth("nanomdm", p.key)
	req.Header.Set("User-Agent", "stepcollect")
	start := time.Now()
	resp, err := p.client.Do(req)
	if err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return metrics.RePushError // stopping
		}
		log.Warn().Err(config.RedactError(err, p.base)).Int64("duration_ms", time.Since(start).Milliseconds()).Msg("push failed: no answer from the push API")
		return metrics.RePushError
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so the connection is reused
	resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		log.Warn().Int("status", resp.StatusCode).Int64("duration_ms", time.Since(start).Milliseconds()).Msg("push refused by the push API")
		return metrics.RePushHTTPError
	}
	return metrics.RePushOK
}
