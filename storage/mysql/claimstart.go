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
// outbox: after the highest row it claimed so far, where a burst leaves
// thousands of in-flight and not-yet-purged rows before it to pass over;
// or from the start, since rows below that point can still become due (a
// late commit, a lapsed lease, an ended backoff, a release). A claim
// scans from the start when the one before it came back short of its
// limit and at least every fullScanEvery (docs/design.md, "Events: the
// outbox and delivery"; measured in docs/benchmarks.md).
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
