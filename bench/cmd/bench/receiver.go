package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"
)

// receiver is the workflow engine's side of the callbacks, in the bench
// process: it answers every POST 200 at once and records, for each
// step.completed event_id, when it first arrived. Arrival times are taken
// on the bench's monotonic clock, the one the webhook 200s are timed on.
type receiver struct {
	URL string
	srv *http.Server

	mu       sync.Mutex
	first    map[string]time.Time // step.completed event_id → first arrival
	received int                  // step.completed POSTs, duplicates included
	other    map[string]int       // POSTs of other event types, by type
	last     time.Time            // arrival of the newest distinct step.completed
	target   int
	reached  chan struct{}
}

func startReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &receiver{URL: fmt.Sprintf("http://%s/callback", ln.Addr()), first: map[string]time.Time{}, other: map[string]int{}}
	rc.srv = &http.Server{Handler: http.HandlerFunc(rc.serve), ReadHeaderTimeout: 10 * time.Second}
	go rc.srv.Serve(ln)
	return rc, nil
}

func (rc *receiver) close() { rc.srv.Close() }

func (rc *receiver) serve(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 4<<20))
	at := time.Now()
	if err != nil || r.Method != http.MethodPost {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	var ev struct {
		EventID string `json:"event_id"`
		Type    string `json:"type"`
	}
	if err := json.Unmarshal(body, &ev); err != nil || ev.EventID == "" {
		// a 4xx makes the worker retry it: it shows as a duplicate, not as
		// a silent loss
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	rc.mu.Lock()
	if ev.Type != "step.completed" {
		rc.other[ev.Type]++
	} else {
		rc.received++
		if _, seen := rc.first[ev.EventID]; !seen {
			rc.first[ev.EventID] = at
			rc.last = at
			if rc.reached != nil && len(rc.first) >= rc.target {
				close(rc.reached)
				rc.reached = nil
			}
		}
	}
	rc.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// counts returns the step.completed POSTs received, the distinct event
// ids among them, and when the newest distinct one arrived.
func (rc *receiver) counts() (received, distinct int, last time.Time) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.received, len(rc.first), rc.last
}

// await waits until n distinct step.completed events have arrived, or for
// stall without a new one, or for at most limit. It reports whether all n
// arrived.
func (rc *receiver) await(n int, stall, limit time.Duration) bool {
	start := time.Now()
	deadline := start.Add(limit)
	for {
		rc.mu.Lock()
		if len(rc.first) >= n {
			rc.mu.Unlock()
			return true
		}
		rc.target, rc.reached = n, make(chan struct{})
		ch, last := rc.reached, rc.last
		rc.mu.Unlock()
		if last.Before(start) {
			last = start
		}
		wait := min(time.Until(deadline), time.Until(last.Add(stall)))
		if wait <= 0 {
			return false
		}
		select {
		case <-ch:
			return true
		case <-time.After(min(wait, time.Second)):
		}
	}
}

// arrivals returns the first arrival of every distinct step.completed
// event, in order.
func (rc *receiver) arrivals() []time.Time {
	rc.mu.Lock()
	out := make([]time.Time, 0, len(rc.first))
	for _, t := range rc.first {
		out = append(out, t)
	}
	rc.mu.Unlock()
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}
