package nanocmdapp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/micromdm/nanolib/log"
	"github.com/micromdm/nanolib/log/ctxlog"

	"github.com/stepcollect/stepcollect/metrics"
)

// DefaultMaxURLBytes bounds an enqueue or push URL: under the 8 KiB request
// line that common reverse proxies (nginx's large_client_header_buffers)
// take, about 200 UUID-long ids. NanoMDM's own server takes 1 MiB.
const DefaultMaxURLBytes = 8000

// maxAnswer bounds what is read of the MDM server's answer to one request
// (NanoMDM's names each id with an error: about 100 bytes an id).
const maxAnswer = 8 << 20

// mdmAPI is the MDM server's enqueue and push API as NanoCMD's foss package
// calls it (PUT enqueue-url/id1,id2 with the command plist, GET
// push-url/id1,id2, HTTP Basic), but reads what the server answers. A
// command UUID is sent in one request only: NanoMDM stores a command once
// and refuses its UUID again. docs/design.md, "Fan-outs through NanoMDM".
type mdmAPI struct {
	client          *http.Client
	enqURL, pushURL *url.URL
	user, key       string
	method          string
	multi           bool // false for MicroMDM: one id a command
	maxURL          int
	metrics         *metrics.MDM
	logger          log.Logger
}

func newMDMAPI(enqRef, pushRef, key string, microMDM bool, maxURL int, m *metrics.MDM, logger log.Logger) (*mdmAPI, error) {
	a := &mdmAPI{
		// an enqueue of a few thousand ids takes NanoMDM seconds on MySQL
		client: &http.Client{Timeout: 2 * time.Minute},
		user:   "nanomdm", key: key, method: http.MethodPut, multi: true,
		maxURL: maxURL, metrics: m, logger: logger,
	}
	if microMDM {
		a.user, a.method, a.multi = "micromdm", http.MethodPost, false
	}
	var err error
	if a.enqURL, err = baseURL(enqRef); err != nil {
		return nil, fmt.Errorf("-enqueue-url: %w", err)
	}
	if a.pushURL, err = baseURL(pushRef); err != nil {
		return nil, fmt.Errorf("-push-url: %w", err)
	}
	return a, nil
}

// baseURL is ref ending in "/", as ids are appended to it.
func baseURL(ref string) (*url.URL, error) {
	if !strings.HasSuffix(ref, "/") {
		ref += "/"
	}
	u, err := url.Parse(ref)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Host == "") {
		err = fmt.Errorf("%q: not an http(s) URL", ref)
	}
	return u, err
}

// SupportsMultiCommands is what the engine asks: with false it starts a
// workflow one id at a time, each with its own command UUIDs.
func (a *mdmAPI) SupportsMultiCommands() bool { return a.multi }

// idsURL is base with ids appended, each escaped as a path segment.
func idsURL(base *url.URL, ids []string) string {
	var b strings.Builder
	b.WriteString(base.String())
	for i, id := range ids {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(url.PathEscape(id))
	}
	return b.String()
}

// groups splits ids into runs whose enqueue and push URLs each stay within
// maxURL (at least one id a run; one a run for MicroMDM).
func (a *mdmAPI) groups(ids []string) [][]string {
	if !a.multi {
		out := make([][]string, len(ids))
		for i, id := range ids {
			out[i] = []string{id}
		}
		return out
	}
	base := max(len(a.enqURL.String()), len(a.pushURL.String()))
	var out [][]string
	start, size := 0, base
	for i, id := range ids {
		n := len(url.PathEscape(id)) + 1
		if i > start && size+n > a.maxURL {
			out = append(out, ids[start:i])
			start, size = i, base
		}
		size += n
	}
	if start < len(ids) {
		out = append(out, ids[start:])
	}
	return out
}

// nanoMDMAnswer is NanoMDM's JSON answer to an enqueue or a push
// (api.APIResult in NanoMDM v0.9.0): errors are strings.
type nanoMDMAnswer struct {
	CommandError string `json:"command_error"`
	PushError    string `json:"push_error"`
	Status       map[string]struct {
		CommandError string `json:"command_error"`
		PushError    string `json:"push_error"`
	} `json:"status"`
}

// EnqueueError names the ids a command was not enqueued for and why, in
// the MDM server's words.
type EnqueueError struct {
	Failed    map[string]string // id: the reason
	Of        int               // ids in the request or the step
	Cancelled bool              // their steps were cancelled
}

func (e *EnqueueError) Error() string {
	s := fmt.Sprintf("MDM server did not enqueue a command for %d of %d ids: %s", len(e.Failed), e.Of, describeFailures(e.Failed))
	switch {
	case e.Cancelled && len(e.Failed) < e.Of:
		s += "; their steps are cancelled, the other ids' started"
	case e.Cancelled:
		s += "; their steps are cancelled"
	}
	return s
}

// describeFailures names up to five ids with their reasons, grouped by reason.
func describeFailures(failed map[string]string) string {
	byReason := map[string][]string{}
	for id, why := range failed {
		byReason[why] = append(byReason[why], id)
	}
	reasons := make([]string, 0, len(byReason))
	for why := range byReason {
		reasons = append(reasons, why)
	}
	sort.Strings(reasons)
	var parts []string
	for _, why := range reasons {
		ids := byReason[why]
		sort.Strings(ids)
		named := strings.Join(ids[:min(5, len(ids))], ", ")
		if len(ids) > 5 {
			named += fmt.Sprintf(" and %d more", len(ids)-5)
		}
		parts = append(parts, fmt.Sprintf("%s (%s)", named, why))
	}
	return strings.Join(parts, "; ")
}

// enqueueReport collects, for one step's enqueue, the ids the MDM server
// did not take. With one in the context, Enqueue records failures there and
// returns nil, so that the engine goes on to the step's other commands and
// the caller cancels the step exactly for the ids that lack one.
type enqueueReport struct {
	mu     sync.Mutex
	failed map[string]string
}

type reportKey struct{}

func withEnqueueReport(ctx context.Context) (context.Context, *enqueueReport) {
	r := &enqueueReport{failed: map[string]string{}}
	return context.WithValue(ctx, reportKey{}, r), r
}

func (r *enqueueReport) add(failed map[string]string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id, why := range failed {
		if _, ok := r.failed[id]; !ok {
			r.failed[id] = why
		}
	}
}

// Enqueue sends rawCommand to ids in one request and reads the answer. The
// command's push failing is not its enqueue failing: NanoMDM answers 500
// with a push_error for a command it queued (no push certificate, APNs
// down), and the device gets it at its next check-in.
func (a *mdmAPI) Enqueue(ctx context.Context, ids []string, rawCommand []byte) error {
	if len(ids) == 0 {
		return nil
	}
	if !a.multi && len(ids) > 1 {
		return errors.New("enqueue: MicroMDM takes one id a command")
	}
	failed := a.enqueue(ctx, ids, rawCommand)
	if len(failed) == 0 {
		return nil
	}
	if r, ok := ctx.Value(reportKey{}).(*enqueueReport); ok {
		r.add(failed)
		return nil
	}
	return &EnqueueError{Failed: failed, Of: len(ids)}
}

// enqueue does one request and returns the ids it failed for, with why.
func (a *mdmAPI) enqueue(ctx context.Context, ids []string, rawCommand []byte) map[string]string {
	logger := ctxlog.Logger(ctx, a.logger).With("request", "enqueue", "id_count", len(ids), "id_first", ids[0])
	all := func(why string) map[string]string {
		f := make(map[string]string, len(ids))
		for _, id := range ids {
			f[id] = why
		}
		return f
	}
	status, body, err := a.do(ctx, a.method, idsURL(a.enqURL, ids), rawCommand)
	if err != nil {
		a.metrics.Enqueued(metrics.MDMEnqueueError, len(ids))
		logger.Info("msg", "enqueue", "err", err)
		return all(err.Error())
	}
	var ans nanoMDMAnswer
	decoded := a.multi && json.Unmarshal(body, &ans) == nil
	failed := map[string]string{}
	switch {
	case decoded && ans.CommandError != "":
		failed = all(fmt.Sprintf("HTTP %d: %s", status, ans.CommandError))
	case decoded:
		pushFailed := 0
		for id, st := range ans.Status {
			if st.CommandError != "" {
				failed[id] = fmt.Sprintf("HTTP %d: %s", status, st.CommandError)
			} else if st.PushError != "" {
				pushFailed++
			}
		}
		if ans.PushError != "" && len(ans.Status) == 0 {
			pushFailed = len(ids)
		}
		if status/100 != 2 && len(failed) == 0 && pushFailed == 0 && ans.PushError == "" {
			failed = all(fmt.Sprintf("HTTP %d: %s", status, snippet(body)))
		}
		if pushFailed > 0 {
			a.metrics.PushFailed(pushFailed)
			why := ans.PushError
			if why == "" {
				why = "per-enrollment push errors"
			}
			logger.Info("msg", "enqueued; push failed (the device gets the command at its next check-in)", "push_failed", pushFailed, "err", why)
		}
	case status/100 != 2:
		failed = all(fmt.Sprintf("HTTP %d: %s", status, snippet(body)))
	}
	a.metrics.Enqueued(metrics.MDMEnqueueRefused, len(failed))
	a.metrics.Enqueued(metrics.MDMEnqueueOK, len(ids)-len(failed))
	if len(failed) > 0 {
		logger.Info("msg", "enqueue refused", "refused", len(failed), "err", describeFailures(failed))
	}
	return failed
}

// Push asks the MDM server to push ids, as many a request as fit the URL
// bound. Push is best effort: a device also checks in on its own.
func (a *mdmAPI) Push(ctx context.Context, ids []string) error {
	var errs []error
	for _, g := range a.groups(ids) {
		status, body, err := a.do(ctx, http.MethodGet, idsURL(a.pushURL, g), nil)
		if err == nil && status/100 != 2 {
			err = fmt.Errorf("HTTP %d: %s", status, snippet(body))
		}
		if err != nil {
			a.metrics.PushFailed(len(g))
			errs = append(errs, fmt.Errorf("push to %d ids (first %s): %w", len(g), g[0], err))
		}
	}
	return errors.Join(errs...)
}

func (a *mdmAPI) do(ctx context.Context, method, ref string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, ref, rd)
	if err != nil {
		return 0, nil, err
	}
	req.SetBasicAuth(a.user, a.key)
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("reading the answer: %w", err)
	}
	return resp.StatusCode, b, nil
}

// snippet is the start of an answer's body, for an error line.
func snippet(b []byte) string {
	s := strings.TrimSpace(strings.ToValidUTF8(string(b), "?"))
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "") + "…"
	}
	if s == "" {
		return "(no body)"
	}
	return s
}
