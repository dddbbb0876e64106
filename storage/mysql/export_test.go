package mysql

import (
	"strings"
	"time"
)

// TwoTrips says whether s runs completions in two round trips (conntx.go).
func TwoTrips(s *Storage) bool { return s.twoTrips }

// OneTrips says how many of s's completions committed in one round trip
// (onetrip.go), and how many its guard sent to the second.
func OneTrips(s *Storage) (committed, refused int64) {
	return s.hints.committed.Load(), s.hints.refused.Load()
}

// OneTripStores says how many of s's results that left another command
// outstanding committed in one round trip (onetrip.go), and how many its
// guard sent to the second.
func OneTripStores(s *Storage) (committed, refused int64) {
	return s.hints.storesCommitted.Load(), s.hints.storesRefused.Load()
}

// PredictedStore is the UPDATE a result predicted to leave the commands
// outstanding outstanding sends (onetrip.go), with its arguments.
func PredictedStore(id, own string, stepID int64, outstanding []string) (string, []any) {
	q := qRecordResultIf + strings.TrimSuffix(strings.Repeat("?, ", 1+len(outstanding)), ", ") + ")"
	args := []any{own, []byte("<plist/>"), own, id, stepID, own}
	for _, o := range outstanding {
		args = append(args, o)
	}
	return q, args
}

// NoPredictions turns s's one-round-trip completions off.
func NoPredictions(s *Storage) { s.hints.off = true }

// NoProcedure makes s's one-round-trip completions send the
// multi-statement query, never the routine's CALL (procedure.go).
func NoProcedure(s *Storage) { s.proc.off = true }

// Calls says how many of s's one-round-trip completions and stores
// committed as one CALL of their routine.
func Calls(s *Storage) int64 { return s.hints.called.Load() }

// SingleCalls says how many of Calls were completions sent as
// stepcollect_complete_single (migration 13).
func SingleCalls(s *Storage) int64 { return s.hints.calledSingle.Load() }

// PredictedDelete is the delete a completion predicted to find own
// outstanding and others stored sends first (onetrip.go), with its
// arguments (the others' results hashed as empty).
func PredictedDelete(id, own string, stepID int64, others []string) (string, []any) {
	q := qDeletePredicted + qDeletePredictedOutstanding
	args := []any{id, own, stepID}
	for _, o := range others {
		q += " OR " + qDeletePredictedStored
		args = append(args, id, o, stepID, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
	}
	return q, args
}

// ActiveResultsPeak is the most results s has had in a transaction at once
// (WithMaxActiveResults); 0 without a bound.
func ActiveResultsPeak(s *Storage) int64 { return s.resultsPeak.Load() }

// FullScanEvery sets how long s's event claims go at most without one that
// reads the outbox from its start (claimstart.go).
func FullScanEvery(s *Storage, d time.Duration) { s.claims.every = d }
