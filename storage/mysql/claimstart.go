package mysql

import (
	"sync/atomic"
	"time"

	"github.com/stepcollect/stepcollect/storage"
)

// fullScanEvery is the longest a process's event claims go without one
// that scans the outbox from its start (claimStart).
const fullScanEvery = 250 * time.Millisecond

// claimStart is where this process's next event claim starts reading the
// outbox: after the highest row it claimed so far, or from the start.
//
// A claim reads the outbox's held_at index in id order, and from its
// start it passes over every event being delivered (each a row lookup for
// its lease) and every acknowledged one the server has not purged yet (a
// delete-marked entry). In a burst those are thousands: reading only after
// the last row claimed cut the server's CPU a result to done by 8% in the
// service row (docs/bench/claimstart-2026-12-04).
//
// Rows at or below that point can still become due: an event whose
// transaction committed after a claim passed over its row (ids are taken
// at INSERT, so they commit out of order and SKIP LOCKED skips the
// uncommitted), a lease that lapsed, a backoff that ended, an event an
// operator released. So a claim scans from the start whenever the one
// before it came back short of its limit (the worker has caught up, which
// the dispatcher's idle polls always are) and at least every
// fullScanEvery: nothing waits for a quiet moment longer than that.
type claimStart struct {
	highest  atomic.Int64 // the highest row id this process claimed
	full     atomic.Bool  // the next claim scans from the start
	lastFull atomic.Int64 // when the last full scan started (UnixNano)
	// every is fullScanEvery, but in tests
	every time.Duration
}

// from returns the row id the claim starting at now reads after: 0 for a
// full scan.
func (c *claimStart) from(now time.Time) int64 {
	every := c.every
	if every == 0 {
		every = fullScanEvery
	}
	if c.full.Load() || now.UnixNano()-c.lastFull.Load() >= int64(every) {
		c.full.Store(false)
		c.lastFull.Store(now.UnixNano())
		return 0
	}
	return c.highest.Load()
}

// claimed records what a committed claim returned (in id order); after
// is the row it read after, 0 for a full scan. A full scan's last row
// becomes the point to read after even if lower than before: after a
// failover to a replica that lost the last writes, new events are given
// ids already seen, and reading after the old highest would make every
// other claim come back empty.
func (c *claimStart) claimed(after int64, out []*storage.OutboxEvent, limit int) {
	if len(out) < limit {
		c.full.Store(true)
	}
	if len(out) == 0 {
		return
	}
	last := out[len(out)-1].ID
	if after == 0 {
		c.highest.Store(last)
		return
	}
	for {
		h := c.highest.Load()
		if h >= last || c.highest.CompareAndSwap(h, last) {
			return
		}
	}
}
