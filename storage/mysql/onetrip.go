package mysql

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

// A result this process can predict goes in one round trip with no locking
// read: a completion deletes its predicted rows by key and writes its event,
// a store updates its predicted rows by key, and a guard makes the server
// refuse the rest of the transaction unless every row was in its predicted
// state; a refused prediction is rolled back and runs the two-trip path.
// The hints kept here are never a source of truth: one stale, evicted or
// never learned only makes the guard refuse. The argument, and why no row
// can be missing from a prediction (invariant 8): docs/design.md, "How a
// result is committed".

// hintsMaxShapes bounds the command → step entries kept, and
// hintsMaxEnrollments and hintsMaxBytes the enrollments whose stored
// results are kept, and those results' bytes. hintsMaxResult is the
// largest result kept (the locking read's inlining bound).
const (
	hintsMaxShapes      = 8192
	hintsMaxEnrollments = 65536
	hintsMaxBytes       = 32 << 20
	hintsMaxResult      = inlineResultMax
)

// hintRow is one id_commands row as a hint has it.
type hintRow struct {
	commandUUID string
	requestType string
	completed   bool
	result      []byte
	known       bool // result is the stored one (completed rows only)
}

// stepShape is a step's commands as one enrollment's rows showed them.
type stepShape struct {
	stepID int64
	rows   []hintRow // every one outstanding
}

// enrollmentRows is an enrollment's rows of one step after a result this
// process stored.
type enrollmentRows struct {
	stepID int64
	rows   []hintRow
}

func (e enrollmentRows) size() int {
	n := 64
	for _, r := range e.rows {
		n += len(r.commandUUID) + len(r.requestType) + len(r.result) + 64
	}
	return n
}

type hints struct {
	mu          sync.Mutex
	shapes      *fifo[string, stepShape]
	enrollments *fifo[string, enrollmentRows]
	off         bool // no predictions (tests)

	// what the predictions did, for tests and the bench's explanation
	committed    atomic.Int64 // completions sent in one round trip and committed
	called       atomic.Int64 // completions and stores sent as a CALL and committed (procedure.go)
	calledSingle atomic.Int64 // the completions among them sent as stepcollect_complete_single
	refused      atomic.Int64 // the guard refused: two round trips
	// the same of results predicted to leave a command outstanding
	storesCommitted atomic.Int64
	storesRefused   atomic.Int64

	odds *fifo[string, *storeOdds] // by command UUID
}

// storeOdds is how the store predictions of one command have gone in this
// process lately. Behind a load balancer spreading an enrollment's results
// over k replicas, a replica that did not store an enrollment's first
// result sees its second with nothing but the step's shape, which
// predicts it first: refused, every time. A command whose predictions
// are mostly refused is predicted only now and then (to see whether that
// changed), and so costs what it cost before there were store
// predictions: the two round trips, not a refusal more.
type storeOdds struct{ committed, refused, skipped int }

const (
	oddsSlack = 4  // refusals more than commits before a command is skipped
	oddsRetry = 32 // of a skipped command's results, one is predicted still
	oddsDecay = 64 // past this many outcomes both halve: the odds are recent
)

// tryStore says whether a store prediction of command cmd is worth
// sending. Called with h.mu held.
func (h *hints) tryStore(cmd string) bool {
	o, ok := h.odds.get(cmd)
	if !ok || o.refused <= o.committed+oddsSlack {
		return true
	}
	o.skipped++
	return o.skipped%oddsRetry == 0
}

// storeWent records how a store prediction of cmd went.
func (h *hints) storeWent(cmd string, committed bool) {
	if committed {
		h.storesCommitted.Add(1)
	} else {
		h.storesRefused.Add(1)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	o, ok := h.odds.get(cmd)
	if !ok {
		o = &storeOdds{}
		h.odds.put(cmd, o)
	}
	if committed {
		o.committed++
	} else {
		o.refused++
	}
	if o.committed+o.refused > oddsDecay {
		o.committed, o.refused = o.committed/2, o.refused/2
	}
}

func newHints() *hints {
	return &hints{
		shapes:      newFIFO[string, stepShape](hintsMaxShapes, 0, nil),
		odds:        newFIFO[string, *storeOdds](hintsMaxShapes, 0, nil),
		enrollments: newFIFO[string](hintsMaxEnrollments, hintsMaxBytes, enrollmentRows.size),
	}
}

// prediction is what a result is predicted to find: the completed step
// it makes, and the enrollment's other rows of it, each stored; or, when
// another command is predicted outstanding (complete nil), those rows,
// for the store.
type prediction struct {
	stepID   int64
	complete *nanostorage.StepResult
	own      hintRow
	others   []hintRow
	// a store: how many of others are outstanding
	outstanding int
}

// predictMaxRows bounds the rows of a step a store is predicted over, so
// that its tally (qRecordResultIf) cannot reach the reported command's
// 1000 by the others alone.
const predictMaxRows = 256

// predict says what id's result sc is predicted to find; nil when this
// process does not know enough.
func (s *Storage) predict(id string, sc *nanostorage.StepCommandResult) *prediction {
	h := s.hints
	if h.off {
		return nil
	}
	h.mu.Lock()
	var stepID int64
	var rows []hintRow
	if e, ok := h.enrollments.get(id); ok && slices.ContainsFunc(e.rows, func(r hintRow) bool { return r.commandUUID == sc.CommandUUID }) {
		stepID, rows = e.stepID, e.rows
	} else if sh, ok := h.shapes.get(sc.CommandUUID); ok {
		// an enrollment of a fan-out this process has seen, none of
		// whose results it stored: its first, it predicts
		stepID, rows = sh.stepID, sh.rows
	}
	h.mu.Unlock()
	if stepID == 0 || len(rows) > predictMaxRows {
		return nil
	}
	var own *hintRow
	p := &prediction{stepID: stepID, others: make([]hintRow, 0, max(len(rows)-1, 0))}
	for i := range rows {
		switch r := &rows[i]; {
		case r.commandUUID == sc.CommandUUID:
			own = r
		case !r.completed:
			p.outstanding++
			p.others = append(p.others, *r)
		case !r.known:
			return nil // a result this process did not keep
		default:
			p.others = append(p.others, *r)
		}
	}
	if own == nil || own.completed {
		return nil // a result reported again: the two-trip path knows what to do
	}
	p.own = *own
	step, ok := s.steps.get(stepID)
	if !ok {
		return nil
	}
	if p.outstanding > 0 {
		h.mu.Lock()
		defer h.mu.Unlock()
		if !h.tryStore(sc.CommandUUID) {
			return nil
		}
		return p
	}
	// The completed step as readCompletedStep makes it: this result, then
	// the others in command_uuid order.
	this := *sc
	if this.RequestType == "" {
		this.RequestType = own.requestType
	}
	ret := &nanostorage.StepResult{StepContext: step, IDs: []string{id}, Commands: []nanostorage.StepCommandResult{this}}
	slices.SortFunc(p.others, func(a, b hintRow) int { return strings.Compare(a.commandUUID, b.commandUUID) })
	for _, r := range p.others {
		ret.Commands = append(ret.Commands, nanostorage.StepCommandResult{CommandUUID: r.commandUUID, RequestType: r.requestType, ResultReport: r.result, Completed: true})
	}
	p.complete = ret
	return p
}

// rows are the enrollment's rows of the step as p predicts them before
// this result, as the locking read would bring them.
func (p *prediction) rows() []idCommandRow {
	out := make([]idCommandRow, 0, len(p.others)+1)
	for _, r := range append([]hintRow{p.own}, p.others...) {
		out = append(out, idCommandRow{commandUUID: r.commandUUID, stepID: p.stepID, requestType: r.requestType, completed: r.completed, resultLen: len(r.result), result: r.result})
	}
	return out
}

// oneTrip runs the completion p predicts in one round trip on ct. done:
// it committed. Otherwise the guard refused it and the transaction is
// rolled back (nothing of it stays), or err.
func (c *completion) oneTrip(ctx context.Context, ct *connTx, a *attempt, p *prediction) (done bool, err error) {
	if p.complete == nil {
		return c.oneTripStore(ctx, ct, a, p)
	}
	branches := []string{qDeletePredictedOutstanding}
	args := []any{c.id, c.sc.CommandUUID, p.stepID}
	for _, r := range p.others {
		branches = append(branches, qDeletePredictedStored)
		sum := sha256.Sum256(r.result)
		args = append(args, c.id, r.commandUUID, p.stepID, hex.EncodeToString(sum[:]))
	}
	args = append(args, len(branches))
	// The event is built, sized and written as the two-trip path's is
	// (writeEvidence): one that does not fit leaves it to that path and
	// its error.
	c.stepID = p.stepID
	if err := c.writeEvidence(ctx, ct, p.complete); err != nil {
		ct.unqueue()
		c.stepID = 0
		return false, errNoPrediction
	}
	var q string
	called := false
	var call string
	var cargs []any
	if !ct.begun {
		if r := c.s.proc.use(ctx, ct.conn); r.all || r.single {
			call, cargs, called = completeCall(c.id, p, ct, r)
		}
	}
	if called {
		// The routine starts the transaction: from here the session may
		// be in it, and release rolls back what did not commit.
		q, args, ct.begun = call, cargs, true
	} else {
		// the guard's count, then the evidence's values: the same
		// arguments whether the guard is a statement of its own or its
		// INSERT's
		args = append(args, ct.args...)
		q = ct.begin(qDeletePredicted+strings.Join(branches, " OR ")) + "; "
		if g, ok := guardedEvidence(ct.stmts); ok {
			q += g + "; COMMIT"
		} else {
			q += qGuardDeleted + "; " + strings.Join(append(ct.stmts, "COMMIT"), "; ")
		}
	}
	whats := strings.Join(ct.whats, ", ")
	ct.unqueue()

	_, err = ct.conn.ExecContext(ctx, q, args...)
	switch no := mysqlErrNo(err); {
	case err == nil:
		ct.ended = true
		c.s.hints.committed.Add(1)
		if called {
			c.s.hints.called.Add(1)
			if q == qCallCompleteSingle {
				c.s.hints.calledSingle.Add(1)
			}
		}
		return true, nil
	case called && (no == erSPDoesNotExist || no == erProcAccessDenied || no == erSPWrongArgs):
		// Refused before any of it ran: the query serves, on the
		// two-trip path this time.
		c.s.proc.failed(err)
		c.stepID = 0
		return false, ct.rollbackRefused(ctx, "a completion", p.stepID)
	case no == erGuardRefused || no == erGuardRefusedNull || (called && no == erGuardRefusedSignal):
		// The delete may have taken some of the rows: nothing of this
		// transaction may stay.
		c.s.hints.refused.Add(1)
		c.stepID = 0
		return false, ct.rollbackRefused(ctx, "a completion", p.stepID)
	}
	if commitUnanswered(ctx, err) {
		// The COMMIT may have run: the next try settles it by its evidence.
		a.ambiguousCommit = true
		c.prev, c.prevStepID = p.complete, p.stepID
	}
	return false, fmt.Errorf("releasing the predicted rows of step %d, %s, then commit (in one round trip): %w", p.stepID, whats, err)
}

// oneTripStore stores the result p predicts leaves another command
// outstanding in one round trip (qRecordResultIf): done, it committed;
// otherwise the guard refused it and the transaction is rolled back, or
// err. Like the two-trip path it first checks that the step.completed
// this result would make, with the results p predicts stored, fits; if
// not, the two-trip path decides on the rows as they are.
func (c *completion) oneTripStore(ctx context.Context, ct *connTx, a *attempt, p *prediction) (done bool, err error) {
	rows := p.rows()
	if c.s.outbox {
		if err := c.s.checkCompletedEvent(ctx, ct, p.stepID, c.id, rows, &rows[0], len(c.sc.ResultReport)); err != nil {
			return false, errNoPrediction
		}
	}
	var q string
	var args []any
	called := false
	if !ct.begun && c.s.proc.use(ctx, ct.conn).all {
		// the routine starts the transaction (see oneTrip)
		q, args = storeCall(c.id, c.sc, p)
		called, ct.begun = true, true
	} else {
		in := strings.TrimSuffix(strings.Repeat("?, ", 1+p.outstanding), ", ") + ")"
		args = []any{c.sc.CommandUUID, c.sc.ResultReport, c.sc.CommandUUID, c.id, p.stepID, c.sc.CommandUUID}
		for _, r := range p.others {
			if !r.completed {
				args = append(args, r.commandUUID)
			}
		}
		args = append(args, tallyOwn+p.outstanding)
		q = ct.begin(qResetTally) + "; " + qRecordResultIf + in + "; " + qGuardTally + "; COMMIT"
	}
	_, err = ct.conn.ExecContext(ctx, q, args...)
	switch no := mysqlErrNo(err); {
	case err == nil:
		ct.ended = true
		c.stepID, c.predicted = p.stepID, p
		c.s.hints.storeWent(c.sc.CommandUUID, true)
		if called {
			c.s.hints.called.Add(1)
		}
		return true, nil
	case called && (no == erSPDoesNotExist || no == erProcAccessDenied || no == erSPWrongArgs):
		// refused before any of it ran: the two-trip path
		c.s.proc.failed(err)
		return false, ct.rollbackRefused(ctx, "a result", p.stepID)
	case no == erGuardRefused || (called && no == erGuardRefusedSignal):
		c.s.hints.storeWent(c.sc.CommandUUID, false)
		return false, ct.rollbackRefused(ctx, "a result", p.stepID)
	}
	if commitUnanswered(ctx, err) {
		// The COMMIT may have run: storing a result again is harmless,
		// and the next try (two round trips) finds it as it stands.
		a.ambiguousCommit = true
	}
	c.stepID = p.stepID
	return false, fmt.Errorf("recording result with the others predicted outstanding (step %d), then commit (in one round trip): %w", p.stepID, err)
}

// rollbackRefused rolls back what ran of a one-round-trip query before
// its guard refused it (the statements before the guard may have taken
// rows): nothing of it may stay, and the try goes on from a fresh
// transaction on the same connection.
func (ct *connTx) rollbackRefused(ctx context.Context, what string, stepID int64) error {
	if _, err := ct.conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("rolling back %s its guard refused (step %d): %w", what, stepID, err)
	}
	ct.begun = false
	return nil
}

// tallyOwn is what the reported command's row counts into the store's
// tally (qRecordResultIf).
const tallyOwn = 1000

// erGuardRefused is ER_WRONG_VALUE_FOR_VAR, which the guards
// (qGuardDeleted, qGuardTally) raise; erGuardRefusedNull is
// ER_BAD_NULL_ERROR, which the guarded evidence INSERTs raise
// (qInsertOutboxGuarded, qInsertReceiptGuarded: nothing else of a
// completion's query writes a NULL into a NOT NULL column).
const (
	erGuardRefused     = 1231
	erGuardRefusedNull = 1048
)

// guardedEvidence is the completion's queued writes as one statement that
// carries the guard of the delete before it (qInsertOutboxGuarded), when
// they are one evidence INSERT; ok false otherwise, and qGuardDeleted goes
// before them.
func guardedEvidence(stmts []string) (q string, ok bool) {
	if len(stmts) != 1 {
		return "", false
	}
	switch stmts[0] {
	case qInsertOutbox:
		return qInsertOutboxGuarded, true
	case qInsertReceipt:
		return qInsertReceiptGuarded, true
	}
	return "", false
}

// errNoPrediction: the prediction cannot be sent as it is; the try goes
// on the two-trip path.
var errNoPrediction = errors.New("no prediction")

// unqueue drops the writes queued so far.
func (ct *connTx) unqueue() { ct.stmts, ct.whats, ct.args = nil, nil, nil }

// seed keeps the shape of a step this process just stored: every
// enrollment of it holds these commands, all outstanding. Without it the
// shape was learned from the step's first committed result, and every
// result already in flight by then took the two round trips: at a
// fan-out's release, the first hundred or so (a quarter of the results
// of the burst's first 250 ms ran a locking read, a twentieth after it,
// docs/bench/pairs-2026-12-05c). Like every hint it is only a
// prediction, which the guard checks.
func (h *hints) seed(stepID int64, cmds []nanostorage.StepCommandRaw) {
	if h.off || stepID == 0 || len(cmds) == 0 {
		return
	}
	shape := stepShape{stepID: stepID, rows: make([]hintRow, len(cmds))}
	for i, c := range cmds {
		shape.rows[i] = hintRow{commandUUID: c.CommandUUID, requestType: c.RequestType}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.putShape(shape)
}

// putShape keeps shape under each of its commands. Called with h.mu held.
func (h *hints) putShape(shape stepShape) {
	for _, r := range shape.rows {
		h.shapes.put(r.commandUUID, shape)
	}
}

// learn keeps what a committed completion showed: the step's shape, from
// the enrollment's rows of it, and those rows with this result stored,
// unless it completed the step (they are gone).
func (h *hints) learn(c *completion) {
	if h.off || c.stepID == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if c.ret != nil {
		h.enrollments.remove(c.id)
	}
	if p := c.predicted; p != nil && p.complete == nil {
		// stored as predicted: the rows as predicted, this one stored
		e := enrollmentRows{stepID: p.stepID, rows: make([]hintRow, 0, len(p.others)+1)}
		own := hintRow{commandUUID: p.own.commandUUID, requestType: p.own.requestType, completed: true}
		if len(c.sc.ResultReport) <= hintsMaxResult {
			own.result, own.known = bytes.Clone(c.sc.ResultReport), true
		}
		e.rows = append(append(e.rows, own), p.others...)
		h.enrollments.put(c.id, e)
		return
	}
	if len(c.rows) == 0 {
		return // committed as predicted: nothing new
	}
	shape := stepShape{stepID: c.stepID, rows: make([]hintRow, len(c.rows))}
	for i, r := range c.rows {
		shape.rows[i] = hintRow{commandUUID: r.commandUUID, requestType: r.requestType}
	}
	h.putShape(shape)
	if c.ret != nil {
		return
	}
	e := enrollmentRows{stepID: c.stepID, rows: make([]hintRow, len(c.rows))}
	for i, r := range c.rows {
		hr := hintRow{commandUUID: r.commandUUID, requestType: r.requestType, completed: r.completed}
		switch {
		case r.commandUUID == c.sc.CommandUUID:
			hr.completed = true
			if len(c.sc.ResultReport) <= hintsMaxResult {
				hr.result, hr.known = bytes.Clone(c.sc.ResultReport), true
			}
		case r.inlined():
			hr.result, hr.known = r.result, true
		}
		e.rows[i] = hr
	}
	h.enrollments.put(c.id, e)
}

// fifo is a map bounded by entries and, with size, bytes, that forgets
// its oldest entries first. Not safe for concurrent use.
type fifo[K comparable, V any] struct {
	max, maxBytes, bytes int
	size                 func(V) int
	m                    map[K]fifoEntry[V]
	order                []fifoKey[K] // oldest first; keys whose seq moved on are skipped
	seq                  uint64
}

type fifoEntry[V any] struct {
	v    V
	seq  uint64
	size int
}

type fifoKey[K comparable] struct {
	k   K
	seq uint64
}

func newFIFO[K comparable, V any](max, maxBytes int, size func(V) int) *fifo[K, V] {
	return &fifo[K, V]{max: max, maxBytes: maxBytes, size: size, m: map[K]fifoEntry[V]{}}
}

func (f *fifo[K, V]) get(k K) (V, bool) {
	e, ok := f.m[k]
	return e.v, ok
}

func (f *fifo[K, V]) put(k K, v V) {
	f.remove(k)
	f.seq++
	e := fifoEntry[V]{v: v, seq: f.seq}
	if f.size != nil {
		e.size = f.size(v)
	}
	f.m[k] = e
	f.bytes += e.size
	f.order = append(f.order, fifoKey[K]{k, f.seq})
	for len(f.m) > f.max || (f.maxBytes > 0 && f.bytes > f.maxBytes) {
		old := f.order[0]
		f.order = f.order[1:]
		if e, ok := f.m[old.k]; ok && e.seq == old.seq {
			f.remove(old.k)
		}
	}
	if len(f.order) > 2*len(f.m)+64 {
		live := f.order[:0:0]
		for _, o := range f.order {
			if e, ok := f.m[o.k]; ok && e.seq == o.seq {
				live = append(live, o)
			}
		}
		f.order = live
	}
}

func (f *fifo[K, V]) remove(k K) {
	if e, ok := f.m[k]; ok {
		f.bytes -= e.size
		delete(f.m, k)
	}
}
