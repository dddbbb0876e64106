package testkit

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"
)

// StallThreshold is how long one probe write may take before the
// StallProbe counts it as the database standing still. A write of one
// row in autocommit takes milliseconds here, under a fault test's load
// too; past a quarter of a second the server (its disk, most often: a
// commit waits for its fsync) is not keeping up with anyone.
const StallThreshold = 250 * time.Millisecond

// probeEvery is how often the probe writes.
const probeEvery = 100 * time.Millisecond

// StallProbe measures how long the database server itself stood still
// while a fault test ran: every probeEvery it commits one row of its own,
// on a connection of its own that reaches the server directly (never
// through the test's proxy), and it remembers every write slower than
// StallThreshold.
//
// The bound of guarantee 8 is the service's: from the end of one fault.
// A machine whose disk stops for ten seconds meanwhile is a second fault
// the service cannot shorten (every commit waits for it, a probe's too),
// and a test that counted it against the service would fail for the
// machine. So the fault tests extend the bound by what the probe saw,
// and say so; a service that is slow on its own is not excused, as the
// probe's writes do not wait for it.
type StallProbe struct {
	mu       sync.Mutex
	slow     []span    // the writes slower than StallThreshold
	inFlight time.Time // when the write under way began (zero: none)
	writes   int
	failed   int
	lastErr  error
	slowest  time.Duration
}

type span struct{ from, to time.Time }

// StartStallProbe starts a probe on db (the test's own view of its
// database), in a table of its own there, until t ends.
func StartStallProbe(t testing.TB, db *sql.DB) *StallProbe {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := db.Conn(ctx)
	if err != nil {
		cancel()
		t.Fatalf("stall probe: a connection of its own: %v", err)
	}
	for _, q := range []string{
		"CREATE TABLE testkit_stall_probe (id INT PRIMARY KEY, n BIGINT NOT NULL) ENGINE=InnoDB",
		"INSERT INTO testkit_stall_probe VALUES (1, 0)",
	} {
		if _, err := conn.ExecContext(ctx, q); err != nil {
			conn.Close()
			cancel()
			t.Fatalf("stall probe: %s: %v", q, err)
		}
	}
	p := &StallProbe{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer conn.Close()
		tick := time.NewTicker(probeEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			p.write(ctx, conn)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

func (p *StallProbe) write(ctx context.Context, conn *sql.Conn) {
	began := time.Now()
	p.mu.Lock()
	p.inFlight = began
	p.mu.Unlock()
	_, err := conn.ExecContext(ctx, "UPDATE testkit_stall_probe SET n = n + 1 WHERE id = 1")
	took := time.Since(began)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight = time.Time{}
	if err != nil {
		if ctx.Err() == nil {
			p.failed++
			p.lastErr = err
		}
		return
	}
	p.writes++
	p.slowest = max(p.slowest, took)
	if took > StallThreshold {
		p.slow = append(p.slow, span{began, began.Add(took)})
	}
}

// Stalled is how long, between from and to, the probe's writes took when
// they took longer than StallThreshold (a write still under way counts
// for as long as it has taken so far).
func (p *StallProbe) Stalled(from, to time.Time) time.Duration {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	spans := p.slow
	if !p.inFlight.IsZero() && time.Since(p.inFlight) > StallThreshold {
		spans = append(spans[:len(spans):len(spans)], span{p.inFlight, time.Now()})
	}
	var d time.Duration
	for _, s := range spans {
		lo, hi := s.from, s.to
		if lo.Before(from) {
			lo = from
		}
		if hi.After(to) {
			hi = to
		}
		if hi.After(lo) {
			d += hi.Sub(lo)
		}
	}
	return d
}

// Writes is how many of the probe's writes have gone through.
func (p *StallProbe) Writes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.writes
}

// String sums up what the probe saw.
func (p *StallProbe) String() string {
	if p == nil {
		return "no stall probe"
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	s := fmt.Sprintf("stall probe: %d writes, %d slower than %v, slowest %v", p.writes, len(p.slow), StallThreshold, p.slowest.Round(time.Millisecond))
	if p.failed > 0 {
		s += fmt.Sprintf(", %d failed (last: %v)", p.failed, p.lastErr)
	}
	return s
}
