package testkit

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
)

// ReceiverOptions shape a Receiver.
type ReceiverOptions struct {
	// HMACKey, when set, is checked as README tells receivers to (standard
	// base64 of HMAC-SHA256 over the body in X-Stepcollect-Signature); a
	// bad signature is answered 401 and counted.
	HMACKey []byte
	// Delay is how long each answer takes, as a slow workflow engine's.
	Delay time.Duration
	// CompletionsOnly holds every event to be one enrollment's
	// step.completed; anything else is a violation.
	CompletionsOnly bool
}

// Receiver is a workflow engine's callback endpoint, written the way the
// README tells receivers to: it checks each event (its id in the header
// and the body; its signature, if asked), deduplicates on event_id, and
// records when each event first arrived, how often each was delivered, and
// that one enrollment's completion of one step always came under one
// event id. Anything wrong it sees is a violation, which Check reports.
type Receiver struct {
	URL  string
	opts ReceiverOptions

	mu        sync.Mutex
	status    int                     // answer every event with this (0: accept)
	events    map[string]events.Event // by event id, the first accepted copy
	first     map[string]time.Time    // event id → first accepted arrival
	times     map[string]int          // event id → times accepted
	arrived   map[string]int          // event id → POSTs read, answered or not yet
	answering int                     // POSTs read and not answered yet
	byPair    map[string]string       // "step_id/enrollment" of a completion → event id
	posts     int                     // every POST
	refused   int                     // answered with status
	badSigned int
	wrong     []string
	last      time.Time // the latest first arrival of a distinct event

	// Completions (step.completed of one enrollment) apart, for the bench:
	// the first arrival of each distinct one in the order they were
	// recorded, the deliveries accepted (duplicates included), and a
	// channel closed (and cleared) when a new distinct one arrives, for
	// AwaitCompletions.
	doneFirst []time.Time
	donePosts int
	doneNews  chan struct{}

	srv *httptest.Server
}

// NewReceiver starts a Receiver for t, closed when t ends.
func NewReceiver(t testing.TB, opts ReceiverOptions) *Receiver {
	r := StartReceiver(opts)
	t.Cleanup(r.Close)
	return r
}

// StartReceiver starts a Receiver outside a test (the bench's); Close
// stops it.
func StartReceiver(opts ReceiverOptions) *Receiver {
	r := &Receiver{opts: opts, events: map[string]events.Event{}, first: map[string]time.Time{},
		times: map[string]int{}, arrived: map[string]int{}, byPair: map[string]string{}}
	r.srv = httptest.NewServer(r)
	r.URL = r.srv.URL
	return r
}

// Close stops the receiver's server.
func (r *Receiver) Close() { r.srv.Close() }

// Poisoned starts, for t, a receiver in front of r that answers 400 to
// the event of enrollment poison while refusing is set, as a receiver does
// to what it cannot parse, and counts that event's POSTs in posts; every
// other POST, and that one once refusing is clear, r takes. It returns the
// URL to deliver to.
func (r *Receiver) Poisoned(t testing.TB, poison string, refusing *atomic.Bool, posts *atomic.Int32) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var ev events.Event
		if json.Unmarshal(body, &ev) == nil && len(ev.Step.IDs) == 1 && ev.Step.IDs[0] == poison {
			posts.Add(1)
			if refusing.Load() {
				http.Error(w, "cannot parse this event", http.StatusBadRequest)
				return
			}
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		r.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func pairKey(stepID int64, enrollment string) string { return fmt.Sprintf("%d/%s", stepID, enrollment) }

func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 4<<20))
	now := time.Now()
	var ev events.Event
	if err == nil {
		err = json.Unmarshal(body, &ev)
	}
	noted := err == nil && ev.EventID != ""
	if noted {
		// noted before the delay: a POST being answered is in flight, and
		// its worker killed now leaves it delivered but not acknowledged
		r.mu.Lock()
		r.arrived[ev.EventID]++
		r.answering++
		r.mu.Unlock()
	}
	// a slow engine: the event counts as received even if the worker is
	// gone by the time it answers, as with a real receiver
	time.Sleep(r.opts.Delay)
	r.mu.Lock()
	defer r.mu.Unlock()
	if noted {
		r.answering--
	}
	r.posts++
	if r.opts.HMACKey != nil {
		mac := hmac.New(sha256.New, r.opts.HMACKey)
		mac.Write(body)
		want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
		if !hmac.Equal([]byte(req.Header.Get("X-Stepcollect-Signature")), []byte(want)) {
			r.badSigned++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
	}
	if err != nil || ev.EventID == "" {
		r.wrong = append(r.wrong, fmt.Sprintf("unreadable event (%v): %.200s", err, body))
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if h := req.Header.Get("X-Stepcollect-Event-Id"); h != ev.EventID {
		r.wrong = append(r.wrong, fmt.Sprintf("X-Stepcollect-Event-Id %q for body event_id %q", h, ev.EventID))
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	if r.status != 0 {
		r.refused++
		http.Error(w, "refusing for the test", r.status)
		return
	}
	completion := ev.Type == events.StepCompleted && len(ev.Step.IDs) == 1
	if r.opts.CompletionsOnly && !completion {
		r.wrong = append(r.wrong, fmt.Sprintf("event %s: type %q with ids %v, want one enrollment's step.completed", ev.EventID, ev.Type, ev.Step.IDs))
	}
	if completion {
		pair := pairKey(ev.Step.StepID, ev.Step.IDs[0])
		if prev, ok := r.byPair[pair]; ok && prev != ev.EventID {
			r.wrong = append(r.wrong, fmt.Sprintf("step/enrollment %s delivered under event ids %s and %s", pair, prev, ev.EventID))
		}
		r.byPair[pair] = ev.EventID
	}
	if _, ok := r.first[ev.EventID]; !ok {
		r.first[ev.EventID] = now
		r.events[ev.EventID] = ev
		if now.After(r.last) {
			r.last = now
		}
		if completion {
			r.doneFirst = append(r.doneFirst, now)
			if r.doneNews != nil {
				close(r.doneNews)
				r.doneNews = nil
			}
		}
	}
	if completion {
		r.donePosts++
	}
	r.times[ev.EventID]++
	w.WriteHeader(http.StatusNoContent)
}

// Refuse answers every event with status from now on (a 503, say); 0
// accepts them again.
func (r *Receiver) Refuse(status int) {
	r.mu.Lock()
	r.status = status
	r.mu.Unlock()
}

// Distinct is how many distinct events were accepted.
func (r *Receiver) Distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.first)
}

// Events is every distinct event accepted, by event id.
func (r *Receiver) Events() map[string]events.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]events.Event, len(r.events))
	for k, v := range r.events {
		out[k] = v
	}
	return out
}

// Times is how often the event was accepted.
func (r *Receiver) Times(eventID string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.times[eventID]
}

// Arrived is every event whose POST the receiver has read, answered or
// still being answered, with how many such POSTs: what a worker killed now
// has delivered, whether or not it saw the answer.
func (r *Receiver) Arrived() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]int, len(r.arrived))
	for k, v := range r.arrived {
		out[k] = v
	}
	return out
}

// Answering is how many POSTs the receiver has read and not answered yet.
func (r *Receiver) Answering() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.answering
}

// Redelivered is every event accepted more than once, with how often.
func (r *Receiver) Redelivered() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for id, n := range r.times {
		if n > 1 {
			out[id] = n
		}
	}
	return out
}

// Last is when the latest distinct event first arrived.
func (r *Receiver) Last() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Completions counts the completions (step.completed of one enrollment)
// accepted: every delivery, duplicates included; the distinct event ids;
// and when the latest distinct one first arrived.
func (r *Receiver) Completions() (posts, distinct int, last time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, at := range r.doneFirst {
		if at.After(last) {
			last = at
		}
	}
	return r.donePosts, len(r.doneFirst), last
}

// CompletionArrivals is the first arrival of every distinct completion, in
// time order.
func (r *Receiver) CompletionArrivals() []time.Time {
	r.mu.Lock()
	out := slices.Clone(r.doneFirst)
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// AwaitCompletions waits until n distinct completions have arrived, and
// reports whether they did: it gives up after stall without a new one
// (counted from the call, or from the latest arrival if later), or after
// limit. A stalled delivery thus costs stall, not limit.
func (r *Receiver) AwaitCompletions(n int, stall, limit time.Duration) bool {
	start := time.Now()
	deadline := start.Add(limit)
	for {
		r.mu.Lock()
		got := len(r.doneFirst)
		last := start
		if got > 0 && r.doneFirst[got-1].After(last) {
			last = r.doneFirst[got-1]
		}
		if got >= n {
			r.mu.Unlock()
			return true
		}
		if r.doneNews == nil {
			r.doneNews = make(chan struct{})
		}
		news := r.doneNews
		r.mu.Unlock()
		wait := min(time.Until(deadline), time.Until(last.Add(stall)))
		if wait <= 0 {
			return false
		}
		select {
		case <-news:
		case <-time.After(wait):
		}
	}
}

// Has reports whether the completion of step by enrollment was delivered.
func (r *Receiver) Has(stepID int64, enrollment string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.byPair[pairKey(stepID, enrollment)]
	return ok
}

// ReceiverStats is what a Receiver counted.
type ReceiverStats struct {
	Distinct  int // distinct events accepted
	Pairs     int // distinct step/enrollment completions
	Posts     int // every POST
	Dups      int // accepted again after a first accept
	Refused   int // answered as Refuse asked
	BadSigned int
}

func (s ReceiverStats) String() string {
	return fmt.Sprintf("%d distinct events (%d completions), %d POSTs, %d redelivered, %d refused, %d badly signed",
		s.Distinct, s.Pairs, s.Posts, s.Dups, s.Refused, s.BadSigned)
}

// Stats is what the receiver counted so far.
func (r *Receiver) Stats() ReceiverStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	dups := 0
	for _, n := range r.times {
		dups += n - 1
	}
	return ReceiverStats{Distinct: len(r.first), Pairs: len(r.byPair), Posts: r.posts, Dups: dups, Refused: r.refused, BadSigned: r.badSigned}
}

// Violations is everything wrong the receiver saw, and the badly signed
// deliveries.
func (r *Receiver) Violations() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := slices.Clone(r.wrong)
	if r.badSigned != 0 {
		out = append(out, fmt.Sprintf("%d deliveries failed the signature check", r.badSigned))
	}
	return out
}

// Check fails t for every violation the receiver saw and every badly
// signed delivery.
func (r *Receiver) Check(t testing.TB) {
	t.Helper()
	for _, v := range r.Violations() {
		t.Errorf("receiver: %s", v)
	}
}
