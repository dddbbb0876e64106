package delivery

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/logkeys"
	"github.com/stepcollect/stepcollect/storage"
)

// failLinesPerSecond bounds the "delivery failed; will retry" lines.
const failLinesPerSecond = 5

// When a POST succeeds after at least kickAfter failures in a row, the
// receiver is taken to be back: the events that failed meanwhile are made
// due at once (up to kickLimit, at most once every kickEvery per worker),
// rather than each at the end of its backoff. A few events a receiver
// refuses among many it takes never make such a run; if they do, they
// are tried once more than their backoff says, at most every kickEvery.
const (
	kickAfter = 8
	kickEvery = 5 * time.Second
	kickLimit = 10000
)

// After brakeAfter POSTs in a row that the receiver did not answer about
// their event (no answer, a timeout, a 5xx, a redirect, or a refusal of
// any request: 401, 403, 407, 408, 429), it is taken to be down, and the
// worker only probes it, one event every probeEvery, until a POST is
// answered (a 2xx, or a 4xx that judges the event: judged); a success then
// ends every backoff (kickAfter). So a receiver that is down is not sent
// every pending event, each failure an UPDATE on the webhooks' database.
// Probes alternate between the newest due event and a random one (a
// prober store): the oldest each time could fail for hours.
const (
	brakeAfter    = 192
	probeEvery    = 250 * time.Millisecond
	probeLogEvery = 30 * time.Second
)

// prober is a DispatchStore that can claim one event for a probe
// (storage/mysql's ClaimProbeEvent); without it a probe claims the oldest.
type prober interface {
	ClaimProbeEvent(ctx context.Context, lease time.Duration, newest bool) (*storage.OutboxEvent, error)
}

// backoffEnder is a DispatchStore that can end every backoff at once
// (storage/mysql's EndBackoffs).
type backoffEnder interface {
	EndBackoffs(ctx context.Context, limit int) (int64, error)
}

// DispatchStore is what the dispatcher needs of the storage.
type DispatchStore interface {
	ClaimDueEvents(ctx context.Context, limit int, lease time.Duration) ([]*storage.OutboxEvent, error)
	// Each names an event by its row and its event id (storage.OutboxRef):
	// a row id alone may name another event after a failover.
	RenewLeases(ctx context.Context, evs []storage.OutboxRef, lease time.Duration) error
	AckEvents(ctx context.Context, evs []storage.OutboxRef) error
	FailEvent(ctx context.Context, ev storage.OutboxRef, reason string, retryAt time.Time) error
	HoldEvent(ctx context.Context, ev storage.OutboxRef, reason string) error
}

// Defaults of the worker's -max-delivery-attempts and -max-delivery-age.
// At the 10 s backoff cap, with jitter, tries come 5 to 10 s apart, so 2000
// attempts last at least 2.8 hours (4 on average): a receiver that is down
// for an hour or two holds nothing, a receiver that refuses one event for
// ever has it set aside by the afternoon (docs/reference.md).
const (
	DefaultMaxDeliveryAttempts = 2000
	DefaultMaxDeliveryAge      = 72 * time.Hour
)

// DefaultLease is the dispatcher's lease. Short, because it is all a
// SIGKILLed worker's successor waits for: the events it held are claimable
// again at most 3 s after its death. Renewed every second while the POST
// runs, a delivery loses its claim only when two renewals in a row fail
// (the database unreachable for 2 s), and then costs at most a duplicate,
// which the receiver's dedup on event_id absorbs.
const DefaultLease = 3 * time.Second

// straggle is how long a loop waits for the POSTs of the batch it claimed
// before it claims again. Nearly every batch is answered within it, so the
// loop claims at the pace its receiver answers; a POST that takes longer
// (a receiver that hangs on some events) keeps its place and holds up the
// loop's next claim by no more than this.
const straggle = time.Second

// DispatchConfig configures a Dispatcher. The zero value is the default,
// but for MaxAttempts and MaxAge, where zero holds nothing.
type DispatchConfig struct {
	// Loops is how many loops claim events at once. Default 4.
	Loops int
	// Batch is the most events one claim takes. Default 64.
	Batch int
	// MaxInflight is the most POSTs the worker has in flight at once (its
	// places): a loop claims as many events as there are free places, so a
	// POST that hangs holds its own place and no other event. Default
	// Loops × Batch (256); less spares a receiver that cannot take as many
	// at once (-max-delivery-inflight).
	MaxInflight int
	// PollInterval is how long an idle loop waits before looking again.
	// Default 100ms: the delivery latency of a quiet system.
	PollInterval time.Duration
	// Lease is how long a claim keeps other workers off an event; it is
	// renewed every third of it while the POST runs, so a worker that dies
	// loses its events to another within one lease. Default DefaultLease.
	Lease time.Duration
	// MaxBackoff caps the wait between tries of an event whose receiver
	// failed: a receiver that comes back is served within it. Default 10s.
	MaxBackoff time.Duration
	// Drain is how long POSTs in flight get to finish once Run's context
	// ends; after that they are abandoned and their leases lapse. Default 8s.
	Drain time.Duration
	// MaxAttempts and MaxAge hold an event whose try fails once it has
	// been tried that often, or is that old (since written or released):
	// it is not tried again until an operator releases it. 0: no limit.
	MaxAttempts int
	MaxAge      time.Duration
}

// Dispatcher delivers the outbox by polling it: each loop claims a batch of
// events nobody is delivering (FOR UPDATE SKIP LOCKED, then a lease), up to
// the places free among MaxInflight POSTs, and starts their POSTs; each is
// acknowledged or given a backoff as it ends, and frees its place. A loop
// waits for its POSTs at most straggle, so a hung POST holds only its own
// place. The outbox decides who delivers: any number of workers may run
// it, nothing depends on Redis, and a dead worker's events are delivered
// by another once their lease lapses (docs/design.md, "Events: the outbox
// and delivery").
type Dispatcher struct {
	cfg DispatchConfig
	d   *Deliverer
	// retryLog is d's logger sampled to failLinesPerSecond lines a second,
	// for the failures that will be retried
	retryLog zerolog.Logger
	// probeLog is d's logger sampled to one line each probeLogEvery, for
	// the probes that fail: while the receiver is down, one line says so
	// now and then, instead of a line a probe
	probeLog zerolog.Logger
	store    DispatchStore
	paused   atomic.Bool // as the last claim of any loop found it: logs once per change
	// failStreak counts the POSTs failed since the last that succeeded;
	// lastKick is when the backoffs were last ended (unix nanoseconds)
	failStreak atomic.Int64
	lastKick   atomic.Int64
	// downStreak counts the POSTs since the last the receiver answered
	// (succeeded or judged); nextProbe is when the next probe may start
	// while it is taken to be down (unix nanoseconds): one loop at a time
	// wins it; probes counts them, to alternate their picks
	downStreak atomic.Int64
	nextProbe  atomic.Int64
	probes     atomic.Int64

	// mine is every event this worker's loops are delivering, until
	// acknowledged or failed. A claim that returns one of them (its lease
	// lapsed behind late renewals, a database slower than a lease) does not
	// POST it again: the short lease may cost a duplicate between workers,
	// never within one.
	mu   sync.Mutex
	mine map[int64]bool
	// acked is every event this worker acknowledged while a claim of one of
	// its loops was running, with when. That claim may still return it: its
	// locking read can come before the acknowledging DELETE (which then
	// waits for the claim's COMMIT), and the loop that posted the event can
	// release it from mine before the claiming loop looks there. Kept until
	// no claim that started before the acknowledgement is running.
	acked  map[int64]time.Time
	claims map[int]time.Time // each loop's claim in progress, since when

	// posts runs every POST on one of MaxInflight goroutines that live
	// as long as Run: a goroutine started for each POST grew its stack
	// through net/http's client every time (a sixth of the worker's CPU
	// in a burst, docs/bench/posters-2026-12-04).
	posts chan func()
	// places are the POSTs that may start, MaxInflight in all.
	places *places
	// leased is every event posted or being acknowledged, with when its
	// lease was last taken or renewed: the renewer keeps their leases.
	leaseMu sync.Mutex
	leased  map[int64]leasedEvent
	// delivered takes each event whose POST succeeded to the acknowledger.
	delivered chan storage.OutboxRef
	inflight  sync.WaitGroup // POSTs started and not ended
	abandoned atomic.Int64   // POSTs cut short by a stop
}

// DefaultMaxInflight is DispatchConfig.MaxInflight's default with the
// default Loops and Batch: the worker's -max-delivery-inflight.
const DefaultMaxInflight = 4 * 64

// MaxInflight is the most POSTs p has in flight at once.
func (p *Dispatcher) MaxInflight() int { return p.cfg.MaxInflight }

// NewDispatcher returns a Dispatcher posting through d.
func NewDispatcher(cfg DispatchConfig, d *Deliverer, store DispatchStore) *Dispatcher {
	if cfg.Loops <= 0 {
		cfg.Loops = 4
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 64
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = cfg.Loops * cfg.Batch
	}
	// a claim takes no more events than there are places
	cfg.Batch = min(cfg.Batch, cfg.MaxInflight)
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 100 * time.Millisecond
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = 10 * time.Second
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 8 * time.Second
	}
	// at most MaxInflight POSTs at once: that many connections, kept
	d.keepOpen(cfg.MaxInflight)
	p := &Dispatcher{cfg: cfg, d: d, store: store, mine: map[int64]bool{}, acked: map[int64]time.Time{}, claims: map[int]time.Time{},
		places: newPlaces(cfg.MaxInflight), leased: map[int64]leasedEvent{},
		// a receiver that is down fails every event, retried every few
		// seconds: a line each was thousands a second, which buried
		// everything else; stepcollect_deliveries_total counts them all
		retryLog: d.logger.Sample(&zerolog.BurstSampler{Burst: failLinesPerSecond, Period: time.Second}),
		probeLog: d.logger.Sample(&zerolog.BurstSampler{Burst: 1, Period: probeLogEvery})}
	d.metrics.SetProbing(p.Probing)
	return p
}

// Probing says whether p takes the receiver to be down and probes it, one
// event at a time (brakeAfter): stepcollect_delivery_probing.
func (p *Dispatcher) Probing() bool { return p.braked() }

type leasedEvent struct {
	ref   storage.OutboxRef
	since time.Time // claimed or last renewed
}

// Run delivers until ctx ends, then lets the POSTs in flight finish (up to
// Drain). Without a callback URL it does nothing: events wait.
func (p *Dispatcher) Run(ctx context.Context) {
	if p.d.cfg.URL == "" {
		<-ctx.Done()
		return
	}
	// POSTs and acks outlive ctx by Drain, so a stop does not turn
	// deliveries already made into redeliveries.
	work, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, func() {
		t := time.AfterFunc(p.cfg.Drain, cancel)
		<-work.Done()
		t.Stop()
	})
	defer stop()
	// there are as many posters as places: a send to posts waits for no
	// other POST
	p.posts = make(chan func())
	var posters sync.WaitGroup
	for range p.cfg.MaxInflight {
		posters.Go(func() {
			for post := range p.posts {
				post()
			}
		})
	}
	defer posters.Wait()
	defer close(p.posts)
	p.delivered = make(chan storage.OutboxRef, p.cfg.MaxInflight)
	ackDone := make(chan struct{})
	go func() {
		defer close(ackDone)
		p.acknowledge(work, p.delivered)
	}()
	renewDone := make(chan struct{})
	go p.renew(work, renewDone)
	var wg sync.WaitGroup
	for i := range p.cfg.Loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.loop(ctx, work, i)
		}()
	}
	wg.Wait()
	p.inflight.Wait() // within Drain: work ends then
	close(p.delivered)
	<-ackDone
	close(renewDone)
	if n := p.abandoned.Load(); n > 0 {
		p.d.logger.Info().Int64(logkeys.Count, n).Stringer("lease", p.cfg.Lease).
			Msg("stopping: deliveries in flight abandoned; their leases lapse and another worker delivers them")
	}
}

func (p *Dispatcher) loop(ctx, work context.Context, i int) {
	failing := false
	for ctx.Err() == nil {
		want := p.cfg.Batch
		probing := p.braked()
		if probing {
			// the receiver is down: one event, when this loop wins the
			// worker's next probe
			if !p.awaitProbe(ctx) {
				continue
			}
			want = 1
		}
		// a whole batch's places, or what is free after a poll interval:
		// claims stay large while POSTs end by the millisecond, and a
		// POST that hangs costs the others no more than the interval
		n := p.places.take(ctx, want, p.cfg.PollInterval)
		if n == 0 {
			return // ctx ended
		}
		p.claimStarts(i)
		evs, err := p.claim(ctx, n, probing)
		if errors.Is(err, storage.ErrDeliveryPaused) {
			if p.paused.CompareAndSwap(false, true) {
				p.d.logger.Info().Msg("delivery paused by an operator; waiting for POST /v1/delivery/resume")
			}
			err = nil
		} else if err == nil && p.paused.CompareAndSwap(true, false) {
			p.d.logger.Info().Msg("delivery resumed")
		}
		if err != nil && ctx.Err() == nil {
			if !failing { // once per outage, not once per poll
				p.d.logger.Warn().Err(err).Msg("claiming events to deliver; retrying")
			}
			failing = true
		} else if err == nil {
			if failing {
				p.d.logger.Info().Msg("claiming events to deliver works again")
			}
			failing = false
		}
		claimed := len(evs)
		evs = p.own(i, evs)
		p.places.give(n - len(evs))
		if len(evs) > 0 {
			// Wait for the batch's POSTs, but no longer than straggle: a
			// loop that claims again while its POSTs run finds little due
			// and claims more often, for fewer events, which cost the
			// server more in a burst than the loops' waits did.
			left := atomic.Int32{}
			left.Store(int32(len(evs)))
			ended := make(chan struct{})
			for _, ev := range evs {
				p.start(work, ev, func() {
					if left.Add(-1) == 0 {
						close(ended)
					}
				})
			}
			t := time.NewTimer(straggle)
			select {
			case <-ended:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		if claimed < n {
			select {
			case <-ctx.Done():
			case <-time.After(p.cfg.PollInterval):
			}
		}
	}
}

// braked says whether the receiver is taken to be down: brakeAfter POSTs
// in a row it did not answer.
func (p *Dispatcher) braked() bool { return p.downStreak.Load() >= brakeAfter }

// claim claims up to n events, or one for a probe.
func (p *Dispatcher) claim(ctx context.Context, n int, probe bool) ([]*storage.OutboxEvent, error) {
	pr, ok := p.store.(prober)
	if !probe || !ok {
		return p.store.ClaimDueEvents(ctx, n, p.cfg.Lease)
	}
	ev, err := pr.ClaimProbeEvent(ctx, p.cfg.Lease, p.probes.Add(1)%2 == 1)
	if ev == nil {
		return nil, err
	}
	return []*storage.OutboxEvent{ev}, err
}

// awaitProbe waits for the worker's next probe time and says whether this
// loop won it (false: another did, or ctx ended; look again).
func (p *Dispatcher) awaitProbe(ctx context.Context) bool {
	next := p.nextProbe.Load()
	if wait := time.Until(time.Unix(0, next)); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return p.nextProbe.CompareAndSwap(next, time.Now().Add(probeEvery).UnixNano())
}

// claimStarts records that loop i's claim is starting: what this worker
// acknowledges from now on may still come back in it (acked).
func (p *Dispatcher) claimStarts(i int) {
	p.mu.Lock()
	p.claims[i] = time.Now()
	p.mu.Unlock()
}

// own keeps the events loop i claimed that no loop of this worker is
// delivering yet or has acknowledged while the claim ran, marks them as
// being delivered, and ends the claim.
func (p *Dispatcher) own(i int, evs []*storage.OutboxEvent) []*storage.OutboxEvent {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := evs[:0]
	for _, ev := range evs {
		if p.mine[ev.ID] {
			// its claim just renewed the lease the POST in flight holds
			p.d.logger.Warn().Int64(logkeys.OutboxID, ev.ID).Str(logkeys.EventID, ev.EventID).Stringer("lease", p.cfg.Lease).
				Msg("claimed an event this worker is still delivering (its lease lapsed: renewals late); not posting it twice")
			continue
		}
		if _, ok := p.acked[ev.ID]; ok {
			p.d.logger.Warn().Int64(logkeys.OutboxID, ev.ID).Str(logkeys.EventID, ev.EventID).Stringer("lease", p.cfg.Lease).
				Msg("claimed an event this worker delivered and acknowledged while the claim ran (its lease lapsed: renewals late); not posting it again")
			continue
		}
		p.mine[ev.ID] = true
		kept = append(kept, ev)
	}
	delete(p.claims, i)
	// what was acknowledged before every running claim started cannot
	// come back: those claims read the outbox after its DELETE committed
	for id, at := range p.acked {
		if !p.claimedBefore(at) {
			delete(p.acked, id)
		}
	}
	return kept
}

// claimedBefore says whether a claim that started before t is running.
// Called with p.mu held.
func (p *Dispatcher) claimedBefore(t time.Time) bool {
	for _, start := range p.claims {
		if start.Before(t) {
			return true
		}
	}
	return false
}

// start POSTs ev, which holds one of the places, on a poster, keeping its
// lease until it is acknowledged or has failed. It is acknowledged as soon
// as its own POST succeeds, never held for another's: a lease that lapsed
// behind a slow sibling would let another worker deliver it again.
func (p *Dispatcher) start(ctx context.Context, ev *storage.OutboxEvent, ended func()) {
	p.leaseMu.Lock()
	p.leased[ev.ID] = leasedEvent{ref: ev.OutboxRef, since: time.Now()}
	p.leaseMu.Unlock()
	p.inflight.Add(1)
	p.posts <- func() {
		defer p.inflight.Done()
		defer ended()
		defer p.places.give(1)
		outcome, err := p.d.post(ctx, ev)
		p.d.metrics.Deliveries.WithLabelValues(ev.Type, outcome).Inc()
		if err == nil || judged(err) {
			// the receiver answers
			if down := p.downStreak.Swap(0); down >= brakeAfter {
				p.d.logger.Info().Int64("unanswered_in_a_row", down).Msg("the receiver answers again; delivering at full rate")
			}
		} else if ctx.Err() == nil && p.downStreak.Add(1) == brakeAfter {
			p.d.logger.Warn().Err(err).Int("unanswered_in_a_row", brakeAfter).Stringer("probe_every", probeEvery).
				Msg("the receiver failed every recent delivery; trying one event at a time until it answers")
		}
		if err == nil {
			p.delivered <- ev.OutboxRef // keeps its lease until acknowledged
			if p.failStreak.Swap(0) >= kickAfter {
				p.kick(ctx)
			}
			return
		}
		if ctx.Err() == nil {
			p.failStreak.Add(1)
		}
		p.release(false, ev.OutboxRef)
		if ctx.Err() != nil {
			p.abandoned.Add(1) // stopping: its lease lapses, another worker takes it
			return
		}
		if p.holds(ev) {
			if herr := p.store.HoldEvent(ctx, ev.OutboxRef, err.Error()); herr != nil {
				p.d.logger.Warn().Err(herr).Int64(logkeys.OutboxID, ev.ID).Msg("holding a failed event; its lease lapses and it is tried again")
				return
			}
			p.d.logger.Warn().Err(err).Int64(logkeys.OutboxID, ev.ID).Str(logkeys.EventID, ev.EventID).Str(logkeys.EventType, ev.Type).
				Int(logkeys.Attempt, ev.Attempts).
				Msg("delivery failed; event held until released (GET /v1/events?state=held, POST /v1/events/{event_id}/deliver)")
			return
		}
		retryAt := time.Now().Add(p.backoff(ev.Attempts))
		if ferr := p.store.FailEvent(ctx, ev.OutboxRef, err.Error(), retryAt); ferr != nil {
			p.d.logger.Warn().Err(ferr).Int64(logkeys.OutboxID, ev.ID).Msg("recording the failed delivery; its lease lapses instead")
		}
		if down := p.downStreak.Load(); down > brakeAfter {
			p.probeLog.Warn().Err(err).Int64("unanswered_in_a_row", down).Stringer("probe_every", probeEvery).
				Msg("the receiver still fails; probing one event at a time (one such line each 30 s)")
			return
		}
		p.retryLog.Warn().Err(err).Int64(logkeys.OutboxID, ev.ID).Str(logkeys.EventID, ev.EventID).Str(logkeys.EventType, ev.Type).
			Int(logkeys.Attempt, ev.Attempts).Time("retry_at", retryAt).Msg("delivery failed; will retry (at most 5 such lines a second per worker)")
	}
}

// kick ends the backoffs of the events that failed while the receiver was
// down, now that it answers again (see kickAfter), at most once every
// kickEvery. Any worker may; the outbox decides who delivers them.
func (p *Dispatcher) kick(ctx context.Context) {
	ender, ok := p.store.(backoffEnder)
	now := time.Now().UnixNano()
	last := p.lastKick.Load()
	if !ok || now-last < int64(kickEvery) || !p.lastKick.CompareAndSwap(last, now) {
		return
	}
	n, err := ender.EndBackoffs(ctx, kickLimit)
	if err != nil {
		p.d.logger.Warn().Err(err).Msg("the receiver answers again; ending the failed events' backoffs failed, they wait them out")
		return
	}
	p.d.logger.Info().Int64(logkeys.Count, n).Msg("the receiver answers again after a run of failures: the events waiting out a backoff (count) are due now; the others were due already")
}

// release ends refs' deliveries, acknowledged (deleted from the outbox) or
// not: their leases are no longer renewed, and a claim may post them again.
func (p *Dispatcher) release(acknowledged bool, refs ...storage.OutboxRef) {
	p.leaseMu.Lock()
	for _, r := range refs {
		delete(p.leased, r.ID)
	}
	p.leaseMu.Unlock()
	p.mu.Lock()
	now := time.Now()
	for _, r := range refs {
		delete(p.mine, r.ID)
		if acknowledged && p.claimedBefore(now) {
			p.acked[r.ID] = now
		}
	}
	p.mu.Unlock()
}

// renew keeps the lease of every event in leased until done: each is
// renewed once a third of a lease has passed since it was claimed or last
// renewed, so a POST answered within that (nearly all of them) costs no
// renewal, and none goes longer than half a lease unrenewed.
func (p *Dispatcher) renew(ctx context.Context, done <-chan struct{}) {
	t := time.NewTicker(p.cfg.Lease / 6)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		now := time.Now()
		var refs []storage.OutboxRef
		p.leaseMu.Lock()
		for id, l := range p.leased {
			if now.Sub(l.since) >= p.cfg.Lease/3 {
				refs = append(refs, l.ref)
				p.leased[id] = leasedEvent{ref: l.ref, since: now}
			}
		}
		p.leaseMu.Unlock()
		if len(refs) == 0 {
			continue
		}
		if err := p.store.RenewLeases(ctx, refs, p.cfg.Lease); err != nil {
			p.d.logger.Warn().Err(err).Msg("renewing delivery leases; another worker may deliver these too (the receiver deduplicates on event_id)")
		}
	}
}

// acknowledge removes each delivered event as it arrives. Events delivered
// while an acknowledgement runs go together in the next statement, so a
// batch answered at once costs a few statements, not one per event.
func (p *Dispatcher) acknowledge(ctx context.Context, delivered <-chan storage.OutboxRef) {
	for ref := range delivered {
		refs := []storage.OutboxRef{ref}
	more:
		for {
			select {
			case ref, ok := <-delivered:
				if !ok {
					break more
				}
				refs = append(refs, ref)
			default:
				break more
			}
		}
		p.release(p.ack(ctx, refs), refs...)
	}
}

// ack removes refs from the outbox and says whether it did.
func (p *Dispatcher) ack(ctx context.Context, refs []storage.OutboxRef) bool {
	if ctx.Err() != nil {
		// the work context is gone: acknowledge on a short one of our own,
		// or these delivered events are delivered again
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		ctx = actx
	}
	if err := p.store.AckEvents(ctx, refs); err != nil {
		// delivered but not removed: they will be delivered again once
		// their lease lapses, which the receiver's dedup on event_id absorbs
		p.d.logger.Warn().Err(err).Int(logkeys.Count, len(refs)).Msg("removing delivered events")
		return false
	}
	p.d.logger.Debug().Int(logkeys.Count, len(refs)).Msg("events delivered")
	return true
}

// holds says whether ev, whose try just failed, has used up its attempts
// or its age.
func (p *Dispatcher) holds(ev *storage.OutboxEvent) bool {
	return (p.cfg.MaxAttempts > 0 && ev.Attempts >= p.cfg.MaxAttempts) ||
		(p.cfg.MaxAge > 0 && ev.Age >= p.cfg.MaxAge)
}

// backoff is the wait before try attempts+1: 1, 2, 4 … seconds with
// jitter, at most MaxBackoff.
func (p *Dispatcher) backoff(attempts int) time.Duration {
	d := min(time.Second<<min(max(attempts-1, 0), 16), p.cfg.MaxBackoff)
	return d/2 + rand.N(d/2+1)
}

// places counts the POSTs that may start. A loop takes a batch's worth,
// or, once it has waited its patience, whatever is free; each POST gives
// its place back as it ends.
type places struct {
	mu      sync.Mutex
	free    int
	changed chan struct{} // closed, and replaced, whenever free grows
}

func newPlaces(n int) *places { return &places{free: n, changed: make(chan struct{})} }

// take takes want places, or after patience at least one, and says how
// many; 0 once ctx ends.
func (pl *places) take(ctx context.Context, want int, patience time.Duration) int {
	timer := time.NewTimer(patience)
	defer timer.Stop()
	waited := false
	for {
		pl.mu.Lock()
		if pl.free >= want || (pl.free > 0 && waited) {
			n := min(pl.free, want)
			pl.free -= n
			pl.mu.Unlock()
			return n
		}
		changed := pl.changed
		pl.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0
		case <-changed:
		case <-timer.C:
			waited = true
		}
	}
}

// give gives n places back.
func (pl *places) give(n int) {
	if n <= 0 {
		return
	}
	pl.mu.Lock()
	pl.free += n
	close(pl.changed)
	pl.changed = make(chan struct{})
	pl.mu.Unlock()
}
