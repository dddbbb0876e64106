package testkit

import (
	"testing"
	"time"
)

// pollEvery is how often a wait looks again: often enough that a test
// measuring how long something took is off by little, seldom enough that
// the looking costs nothing.
const pollEvery = 20 * time.Millisecond

// WaitUntil polls cond until it says done, and returns how long that took.
// cond also returns what it observed; if within passes first, t fails with
// what was awaited and the last value observed, so that a timeout says how
// far off the test was. A wide within is a liveness bound, not a sleep: a
// passing test waits only as long as the condition takes.
func WaitUntil(t testing.TB, within time.Duration, what string, cond func() (done bool, observed any)) time.Duration {
	t.Helper()
	start := time.Now()
	var last any
	if _, ok := Watch(start.Add(within), func() bool {
		var done bool
		done, last = cond()
		return done
	}); !ok {
		t.Fatalf("waited %v for %s; last observed: %v", within, what, last)
	}
	return time.Since(start)
}

// Watch polls cond until it holds, or until gives up, and reports when it
// first held. It fails nothing: tests that measure a bound and keep watching
// after it (to say how late) use it directly; the others use WaitUntil.
func Watch(until time.Time, cond func() bool) (time.Time, bool) {
	return watchUntil(func() time.Time { return until }, cond)
}

// watchUntil is Watch with a deadline that may move (later, as a stall
// probe sees the database stand still).
func watchUntil(until func() time.Time, cond func() bool) (time.Time, bool) {
	for {
		if cond() {
			return time.Now(), true
		}
		if time.Now().After(until()) {
			return time.Time{}, false
		}
		time.Sleep(pollEvery)
	}
}
