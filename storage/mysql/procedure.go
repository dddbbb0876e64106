package mysql

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/rs/zerolog"
)

// A predicted completion, or a predicted store (onetrip.go), is one CALL of
// a routine migration 12 or 13 creates, where the database has them, may
// run them, and they pay (routinesPay): the same work in the same order,
// parsed once per connection and answered once, after COMMIT (the
// migrations say what that saves). Elsewhere the multi-statement queries
// run as before, so a database migrated by an older build, an account
// without EXECUTE, or id_commands columns whose character set the
// routines' parameters do not share costs speed, never a result.

// procRecheck is how long a routine found unusable stays so before it is
// looked for again (a migration run while this process serves).
const procRecheck = time.Minute

type completeProc struct {
	mu      sync.Mutex
	usable  routines
	settled bool      // every routine that pays here is usable: no need to look again
	checked time.Time // zero: never
	looking bool      // a completion is looking now
	told    bool      // the log said migration 12's routines do not pay here
	logger  zerolog.Logger
	off     bool // tests: never use them
}

// routines says which routines a result may CALL.
type routines struct {
	// all: migration 12's, stepcollect_complete_predicted for any
	// completion and stepcollect_store_predicted for a store
	all bool
	// single: migration 13's stepcollect_complete_single, for a completion
	// of the enrollment's only row of the step with its event
	single bool
}

// use says which routines a completion or a store may CALL now, looking
// them up (a non-locking read of information_schema) at first use and,
// while one that pays here is not usable, once per procRecheck. One completion looks, on its
// own connection before its transaction (a second one from the pool would
// wait while completions hold all of them: seen at 300 at once); the
// others send the query meanwhile.
func (p *completeProc) use(ctx context.Context, conn *sql.Conn) routines {
	p.mu.Lock()
	if p.off || p.settled || p.looking || (!p.checked.IsZero() && time.Since(p.checked) < procRecheck) {
		usable := p.usable
		if p.off {
			usable = routines{}
		}
		p.mu.Unlock()
		return usable
	}
	// one completion looks; the others take the query meanwhile
	p.looking = true
	p.mu.Unlock()
	var all, single int
	err := conn.QueryRowContext(ctx, qCompleteProcFits).Scan(&all, &single)
	var logBin bool
	var version string
	if err == nil {
		err = conn.QueryRowContext(ctx, qServerLogBin).Scan(&logBin, &version)
	}
	pays := routinesPay(version, logBin)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.looking = false
	p.usable = routines{all: err == nil && all == 4 && pays, single: err == nil && single == 2}
	// one usable and the other missing (a database migrated to 12 only,
	// say) is looked at again: a migration may bring it while this serves
	p.settled = p.usable.single && (p.usable.all || (err == nil && !pays))
	p.checked = time.Now()
	if err == nil && all == 4 && !pays && !p.told {
		p.told = true
		p.logger.Info().Str("routines", "stepcollect_complete_predicted, stepcollect_store_predicted").
			Msg("results of steps of more than one command send their statements, not migration 12's routines: on MariaDB with its binary log on, those cost the server more than they save; a step's only command still completes with stepcollect_complete_single (docs/benchmarks.md)")
	}
	if err != nil || all != 4 || single != 2 {
		ev := p.logger.Warn().Str("routines", procName)
		if err != nil {
			ev = ev.Err(err)
		}
		ev.Msg("completions go without their routines: one is missing (bin/migrate creates it again), not callable, or its parameters' character set or collation are not id_commands' columns'; every result is committed as before, at more CPU a result")
	}
	return p.usable
}

// routinesPay says whether migration 12's routines save CPU on a server of
// this version with its binary log on or off, as measured
// (BenchmarkPredictedResults, docs/benchmarks.md): on MySQL 9.7 (binary
// log on) and on MariaDB 10.11 without one, the client's and the server's
// CPU a result fell; on MariaDB with its binary log on, whether or not the
// session wrote to it, the server spent more than the client saved.
// Migration 13's routine, four statements without the others' loop, pays
// there too.
func routinesPay(version string, logBin bool) bool {
	return !(logBin && strings.Contains(version, "MariaDB"))
}

// failed records that a CALL was refused before it ran (no such routine,
// or no right to run it): the query serves until the next look.
func (p *completeProc) failed(err error) {
	p.mu.Lock()
	p.usable, p.settled, p.checked = routines{}, false, time.Now()
	p.mu.Unlock()
	p.logger.Warn().Str("routines", procName).Err(err).Msg("completions go without their routines until they are looked for again in a minute: every result is committed as before, at more CPU a result")
}

// procName names the routines (migrations 12 and 13), for the log.
const procName = "stepcollect_complete_predicted, stepcollect_store_predicted, stepcollect_complete_single"

// Errors a CALL of the routine returns without having run any of it.
const (
	erSPDoesNotExist   = 1305 // ER_SP_DOES_NOT_EXIST
	erProcAccessDenied = 1370 // ER_PROCACCESS_DENIED_ERROR
	erSPWrongArgs      = 1318 // ER_SP_WRONG_NO_OF_ARGS: another build's routine
)

// erGuardRefusedSignal is ER_SIGNAL_EXCEPTION: the routine's guard
// (SIGNAL SQLSTATE '45000').
const erGuardRefusedSignal = 1644

// completeCall is the CALL of a routine r allows for p, with the evidence
// a completion queued on ct (an outbox INSERT, a receipt INSERT, both or
// neither); ok false for anything else queued, or where r allows none:
// stepcollect_complete_single for the enrollment's only row of the step
// with its event alone, stepcollect_complete_predicted for any.
func completeCall(id string, p *prediction, ct *connTx, r routines) (q string, args []any, ok bool) {
	var eventID, eventType, payload any
	receipt := false
	rest := ct.args
	for _, s := range ct.stmts {
		switch {
		case s == qInsertOutbox && len(rest) >= 5 && eventID == nil:
			// outboxRow: event_id, event_type, step_id, enrollment_id, payload
			eventID, eventType, payload = rest[0], rest[1], rest[4]
			rest = rest[5:]
		case s == qInsertReceipt && len(rest) >= 2 && !receipt:
			receipt = true
			rest = rest[2:]
		default:
			return "", nil, false
		}
	}
	switch {
	case len(rest) != 0:
		return "", nil, false
	case r.single && len(p.others) == 0 && eventID != nil && !receipt:
		return qCallCompleteSingle, []any{id, p.own.commandUUID, p.stepID, eventID, eventType, payload}, true
	case !r.all:
		return "", nil, false
	}
	var others strings.Builder
	for i, r := range p.others {
		if i > 0 {
			others.WriteByte(',')
		}
		sum := sha256.Sum256(r.result)
		others.WriteString(hex.EncodeToString([]byte(r.commandUUID)))
		others.WriteByte(':')
		others.WriteString(hex.EncodeToString(sum[:]))
	}
	return qCallCompletePredicted, []any{id, p.own.commandUUID, p.stepID, others.String(), len(p.others), eventID, eventType, payload, receipt}, true
}

// storeCall is the CALL of the store's routine for p: the reported
// command's row and the others p predicts outstanding, as ",<hex>,…,".
func storeCall(id string, sc *nanostorage.StepCommandResult, p *prediction) (q string, args []any) {
	var rows strings.Builder
	rows.WriteByte(',')
	n := 1
	rows.WriteString(hex.EncodeToString([]byte(sc.CommandUUID)))
	rows.WriteByte(',')
	for _, r := range p.others {
		if !r.completed {
			rows.WriteString(hex.EncodeToString([]byte(r.commandUUID)))
			rows.WriteByte(',')
			n++
		}
	}
	return qCallStorePredicted, []any{id, sc.CommandUUID, p.stepID, sc.ResultReport, rows.String(), n}
}
