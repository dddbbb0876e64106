package mdmsim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

// FleetConfig is a fleet's size and pace. Zero values take the defaults.
type FleetConfig struct {
	// N is how many devices.
	N int
	// UDIDPrefix names device i UDIDPrefix + i in six digits ("SIM-",
	// the default, gives SIM-000000).
	UDIDPrefix string
	// Concurrency bounds the devices enrolling or polling at once, and
	// the idle connections kept to the server. Default 64.
	Concurrency int
	// PollEvery is how long a device waits between polls, give or take a
	// fifth; its first poll is at a random point within it. Default 1s.
	PollEvery time.Duration
	// IdleAfter ends Run once no device has been handed a command for
	// that long. Zero: Run ends only with its context or Stop.
	IdleAfter time.Duration
	// Behavior is device i's; none (every command Acknowledged) when nil.
	Behavior func(i int) Behavior
	// Logf, when set, gets the fleet's progress every LogEvery (default
	// 5s) while it runs, and once at its end.
	Logf     func(format string, args ...any)
	LogEvery time.Duration
}

// Fleet is N devices enrolled and polling concurrently, sharing one HTTP
// client.
type Fleet struct {
	cfg      FleetConfig
	devices  []*Device
	wake     []chan struct{} // device i's, to poll now
	index    map[string]int  // UDID → i
	counters *counters
	lastCmd  atomic.Int64 // unix nanoseconds of the last command handed out
	stop     chan struct{}
	stopOnce sync.Once

	errMu    sync.Mutex
	firstErr []error // the first few poll errors, for a report
}

// NewFleet makes cfg.N devices with identity certificates from issuer,
// talking to target (its Client, if any, is replaced by the fleet's).
func NewFleet(issuer Issuer, target Target, cfg FleetConfig) (*Fleet, error) {
	cfg.UDIDPrefix = cmp.Or(cfg.UDIDPrefix, "SIM-")
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 64)
	cfg.PollEvery = cmp.Or(cfg.PollEvery, time.Second)
	cfg.LogEvery = cmp.Or(cfg.LogEvery, 5*time.Second)
	target.Client = &http.Client{
		Timeout: time.Minute,
		Transport: &http.Transport{
			MaxIdleConns:        cfg.Concurrency,
			MaxIdleConnsPerHost: cfg.Concurrency,
			IdleConnTimeout:     90 * time.Second,
		},
	}
	f := &Fleet{cfg: cfg, counters: &counters{}, stop: make(chan struct{}), index: map[string]int{}}
	for i := range cfg.N {
		var b Behavior
		if cfg.Behavior != nil {
			b = cfg.Behavior(i)
		}
		d, err := NewDevice(issuer, target, fmt.Sprintf("%s%06d", cfg.UDIDPrefix, i), b)
		if err != nil {
			return nil, err
		}
		d.counters = f.counters
		f.index[d.UDID] = len(f.devices)
		f.devices = append(f.devices, d)
		f.wake = append(f.wake, make(chan struct{}, 1))
	}
	return f, nil
}

// Devices are the fleet's devices, device i at index i.
func (f *Fleet) Devices() []*Device { return f.devices }

// IDs are the devices' UDIDs: their NanoMDM enrollment ids.
func (f *Fleet) IDs() []string {
	ids := make([]string, len(f.devices))
	for i, d := range f.devices {
		ids[i] = d.UDID
	}
	return ids
}

// Enroll enrolls every device, Concurrency at a time, and returns the
// devices' errors (the first few, and how many).
func (f *Fleet) Enroll(ctx context.Context) error {
	var g errgroup.Group
	g.SetLimit(f.cfg.Concurrency)
	var mu sync.Mutex
	var errs []error
	failed := 0
	for _, d := range f.devices {
		g.Go(func() error {
			if err := d.Enroll(ctx); err != nil {
				mu.Lock()
				failed++
				if len(errs) < 3 {
					errs = append(errs, err)
				}
				mu.Unlock()
			}
			return nil
		})
	}
	g.Wait()
	if failed > 0 {
		return fmt.Errorf("%d of %d devices did not enroll: %w", failed, len(f.devices), errors.Join(errs...))
	}
	return nil
}

// Run polls every device until ctx ends, Stop is called, or (with
// IdleAfter) no command was handed out for IdleAfter. It returns ctx's
// error if ctx ended it, else nil; poll errors do not end it (Errors has
// them).
func (f *Fleet) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	f.lastCmd.Store(time.Now().UnixNano())
	sem := make(chan struct{}, f.cfg.Concurrency)
	var wg sync.WaitGroup
	for i, d := range f.devices {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait := time.Duration(rand.Int64N(int64(f.cfg.PollEvery)))
			for sleep(ctx, wait, f.wake[i]) {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
					return
				}
				n, err := d.Poll(ctx)
				<-sem
				if n > 0 {
					f.lastCmd.Store(time.Now().UnixNano())
				}
				if err != nil && ctx.Err() == nil {
					f.keepErr(err)
				}
				// 0.8 to 1.2 times PollEvery
				wait = f.cfg.PollEvery*4/5 + time.Duration(rand.Int64N(int64(f.cfg.PollEvery*2/5)+1))
			}
		}()
	}
	tick := time.NewTicker(min(f.cfg.LogEvery, 100*time.Millisecond))
	defer tick.Stop()
	lastLog := time.Now()
	var ended error // ctx's, if it ended the run
loop:
	for {
		select {
		case <-ctx.Done():
			ended = ctx.Err()
			break loop
		case <-f.stop:
			break loop
		case now := <-tick.C:
			if f.cfg.IdleAfter > 0 && now.Sub(time.Unix(0, f.lastCmd.Load())) > f.cfg.IdleAfter {
				break loop
			}
			if f.cfg.Logf != nil && now.Sub(lastLog) >= f.cfg.LogEvery {
				f.cfg.Logf("mdmsim: %v", f.Progress())
				lastLog = now
			}
		}
	}
	cancel()
	wg.Wait()
	if f.cfg.Logf != nil {
		f.cfg.Logf("mdmsim: %v (ended)", f.Progress())
	}
	return ended
}

// Stop ends Run, and any later Run at once.
func (f *Fleet) Stop() { f.stopOnce.Do(func() { close(f.stop) }) }

// Wake has the devices ids (every device when none is named) poll now
// rather than at their next turn, as an APNs push would: the test server
// cannot push (see package nanomdm).
func (f *Fleet) Wake(ids ...string) {
	wake := func(i int) {
		select {
		case f.wake[i] <- struct{}{}:
		default: // already woken
		}
	}
	if len(ids) == 0 {
		for i := range f.wake {
			wake(i)
		}
	}
	for _, id := range ids {
		if i, ok := f.index[id]; ok {
			wake(i)
		}
	}
}

func (f *Fleet) keepErr(err error) {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	if len(f.firstErr) < 5 {
		f.firstErr = append(f.firstErr, err)
	}
}

// Errors are the first few poll errors of Run.
func (f *Fleet) Errors() []error {
	f.errMu.Lock()
	defer f.errMu.Unlock()
	return append([]error(nil), f.firstErr...)
}

// sleep waits d or until woken, reporting false if ctx ended first.
func sleep(ctx context.Context, d time.Duration, wake <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	case <-wake:
		return true
	}
}

// Progress is the fleet's totals now.
func (f *Fleet) Progress() Progress {
	c := f.counters
	return Progress{Enrolled: c.enrolled.Load(), Polls: c.polls.Load(), Commands: c.commands.Load(),
		Acknowledged: c.acknowledged.Load(), Errors: c.errors.Load(), NotNow: c.notNow.Load(), Failures: c.failures.Load()}
}
