// Package fanout is the benchmark core shared by every implementation's
// binary: one step to N enrollments, all reporting at the same moment (or,
// as the control, N steps of one enrollment each), measured from outside
// through NanoCMD's storage interface.
//
// It imports nothing of stepcollect's, so that NanoCMD v0.7.0 and v0.7.1 can
// each be built into their own binary with it.
package fanout

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

// Modes of measurement.
const (
	ModeFanOut      = "fanout"      // N results of one step (or N steps: Control) at once
	ModeUncontended = "uncontended" // 50 one-enrollment steps answered one result after another
	ModeCancel      = "cancel"      // CancelSteps on a database the driver filled with a large table
)

// Config is one measurement.
type Config struct {
	Impl     string // label of the implementation under test
	Mode     string
	DSN      string // of a migrated database (empty, but for ModeCancel)
	N        int    // enrollments
	Commands int    // commands per step
	Control  bool   // a step each instead of one shared step
	Pool     int    // max open connections
}

// Result is what one measurement found. Latencies are per result, from the
// release of all callers to each call's return.
type Result struct {
	Config
	WallMS    float64        `json:"wall_ms"`
	P50MS     float64        `json:"p50_ms"`
	P99MS     float64        `json:"p99_ms"`
	Completed int            `json:"completed"`
	Errors    map[string]int `json:"errors"` // by MySQL error number, or "other"
	Stranded  Stranded       `json:"stranded"`
	// ModeCancel: latencies of the cancels scoped to a workflow.
	P50Scoped float64 `json:"p50_scoped_ms,omitempty"`
	P99Scoped float64 `json:"p99_scoped_ms,omitempty"`
	// The service: collection lag from the worker's histogram.
	LagP50MS float64 `json:"lag_p50_ms,omitempty"`
	LagP99MS float64 `json:"lag_p99_ms,omitempty"`
	// The service, with the bench's callback receiver: from the last
	// webhook 200 to the steps table first seen empty, and to the arrival
	// of the last of the N distinct step.completed events.
	CollectedAfterMS float64 `json:"collected_after_ms,omitempty"`
	DeliveredAfterMS float64 `json:"delivered_after_ms,omitempty"`
	// step.completed POSTs the receiver answered, duplicates included, and
	// the distinct event ids among them (N when every event arrived).
	EventsReceived int `json:"events_received,omitempty"`
	EventsDistinct int `json:"events_distinct,omitempty"`
	// StepsCollected is the workers' stepcollect_steps_collected_total;
	// OutboxLeft the events still in the outbox at the end.
	StepsCollected int `json:"steps_collected,omitempty"`
	OutboxLeft     int `json:"outbox_left,omitempty"`
	// Config is the server setting the row was measured under.
	Server string `json:"server,omitempty"`
	// CPU is the CPU time each process used during the timed window, in ms
	// (the service rows: api, worker, mysqld, load generator).
	CPU map[string]float64 `json:"cpu_ms,omitempty"`
	// CPUToDone is each process's CPU time from the release to the last
	// event delivered and the step collected (the service rows): the
	// whole work of the fan-out, wherever the window ends.
	CPUToDone map[string]float64 `json:"cpu_to_done_ms,omitempty"`
	// Pair numbers the floor and service rows measured as alternated
	// pairs (the bench's -pairs), from 1; 0 for a row measured once.
	Pair int `json:"pair,omitempty"`
}

// Stranded is what a run left in the tables; all zero when it cleaned up.
type Stranded struct {
	Steps        int `json:"steps"`
	IDCommands   int `json:"id_commands"`
	StepCommands int `json:"step_commands"`
}

// Flags parses the command line every implementation binary shares.
func Flags(impl string) Config {
	c := Config{Impl: impl}
	flag.StringVar(&c.Impl, "label", impl, "label for the results")
	flag.StringVar(&c.Mode, "mode", ModeFanOut, "fanout, uncontended or cancel")
	flag.StringVar(&c.DSN, "dsn", "", "DSN of a migrated, empty database")
	flag.IntVar(&c.N, "n", 300, "enrollments")
	flag.IntVar(&c.Commands, "commands", 1, "commands per step")
	flag.BoolVar(&c.Control, "control", false, "one step per enrollment instead of one shared step")
	flag.IntVar(&c.Pool, "pool", 128, "connection pool size")
	flag.Parse()
	if c.DSN == "" {
		fmt.Fprintln(os.Stderr, "-dsn: required")
		os.Exit(2)
	}
	return c
}

// Main runs one measurement with the storage newStore builds and prints the
// result as one JSON line.
func Main(c Config, newStore func(db *sql.DB) (nanostorage.Storage, error)) {
	db, err := sql.Open("mysql", c.DSN)
	if err != nil {
		fail(err)
	}
	db.SetMaxOpenConns(c.Pool)
	db.SetMaxIdleConns(c.Pool)
	store, err := newStore(db)
	if err != nil {
		fail(err)
	}
	var res *Result
	switch c.Mode {
	case ModeFanOut:
		res, err = Run(context.Background(), c, db, store)
	case ModeUncontended:
		res, err = RunUncontended(context.Background(), c, db, store)
	case ModeCancel:
		res, err = RunCancel(context.Background(), c, db, store)
	default:
		err = fmt.Errorf("-mode: %q is not fanout, uncontended or cancel", c.Mode)
	}
	if err != nil {
		fail(err)
	}
	json.NewEncoder(os.Stdout).Encode(res)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fanout:", err)
	os.Exit(1)
}

// Run stores the steps (untimed), warms the pool, then releases every
// enrollment's result at once and measures.
func Run(ctx context.Context, c Config, db *sql.DB, store nanostorage.Storage) (*Result, error) {
	type call struct{ id, uuid string }
	var calls []call
	steps := 1
	if c.Control {
		steps = c.N
	}
	var built []*nanostorage.StepEnqueuingWithConfig
	for s := range steps {
		step := &nanostorage.StepEnqueuingWithConfig{}
		step.WorkflowName = "io.stepcollect.bench"
		step.InstanceID = "bench-" + strconv.Itoa(s)
		step.Name = "fanout"
		ids := c.N / steps
		for i := range ids {
			step.IDs = append(step.IDs, fmt.Sprintf("BENCH-%07d", s*ids+i))
		}
		for k := range c.Commands {
			step.Commands = append(step.Commands, nanostorage.StepCommandRaw{
				CommandUUID: fmt.Sprintf("BENCH-UUID-%d-%d", s, k), RequestType: "DeviceInformation",
			})
		}
		built = append(built, step)
		for _, id := range step.IDs {
			for _, cmd := range step.Commands {
				calls = append(calls, call{id, cmd.CommandUUID})
			}
		}
	}
	if err := Warm(ctx, db, c.Pool); err != nil {
		return nil, err
	}
	if err := storeAll(ctx, store, built); err != nil {
		return nil, err
	}

	res := &Result{Config: c, Errors: map[string]int{}}
	res.Config.DSN = ""
	lat := make([]time.Duration, len(calls))
	var mu sync.Mutex
	var wg sync.WaitGroup
	release := make(chan struct{})
	for i, cl := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			t0 := time.Now()
			r, err := store.StoreCommandResponseAndRetrieveCompletedStep(ctx, cl.id, result(cl.uuid))
			lat[i] = time.Since(t0)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.Errors[errClass(err)]++
			} else if r != nil {
				res.Completed++
			}
		}()
	}
	start := time.Now()
	close(release)
	wg.Wait()
	res.WallMS = ms(time.Since(start))
	res.P50MS, res.P99MS = quantiles(lat)
	return res, stranded(ctx, db, res)
}

// Warm opens n connections a few at a time and returns them to the pool
// idle: hundreds of simultaneous connects overflow the server's listen
// backlog (a one-second SYN retry) and would be timed as the storage's cost.
func Warm(ctx context.Context, db *sql.DB, n int) error {
	const step = 8
	var held []*sql.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for len(held) < n {
		var batch sync.WaitGroup
		var mu sync.Mutex
		var firstErr error
		for range min(step, n-len(held)) {
			batch.Add(1)
			go func() {
				defer batch.Done()
				c, err := db.Conn(ctx)
				if err == nil {
					err = c.PingContext(ctx)
				}
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					firstErr = err
				} else {
					held = append(held, c)
				}
			}()
		}
		batch.Wait()
		if firstErr != nil {
			return fmt.Errorf("warming the pool: %w", firstErr)
		}
	}
	return nil
}

// ErrClass is the MySQL error number of err, or "other".
func ErrClass(err error) string { return errClass(err) }

func errClass(err error) string {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return strconv.Itoa(int(me.Number))
	}
	return "other"
}

// MS is d in milliseconds.
func MS(d time.Duration) float64 { return ms(d) }

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// storeAll stores steps, sixteen at a time (storing is not what is
// measured; a control of 10000 steps would otherwise take a while).
func storeAll(ctx context.Context, store nanostorage.Storage, steps []*nanostorage.StepEnqueuingWithConfig) error {
	sem := make(chan struct{}, 16)
	errc := make(chan error, len(steps))
	var wg sync.WaitGroup
	for i, st := range steps {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := store.StoreStep(ctx, st, time.Now()); err != nil {
				errc <- fmt.Errorf("storing step %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errc)
	return <-errc
}

// result is one device's answer, as the benchmark sends it.
func result(uuid string) *nanostorage.StepCommandResult {
	return &nanostorage.StepCommandResult{CommandUUID: uuid, RequestType: "DeviceInformation", Completed: true,
		ResultReport: []byte("<?xml version=\"1.0\"?><plist version=\"1.0\"><dict><key>Status</key><string>Acknowledged</string></dict></plist>")}
}

// RunUncontended measures the path nothing contends on: 50 enrollments,
// each with its own step of c.Commands commands, answering one result
// after another. What it shows is the cost of collection's extra round
// trips and commit where nothing is shared.
func RunUncontended(ctx context.Context, c Config, db *sql.DB, store nanostorage.Storage) (*Result, error) {
	const enrollments = 50
	var steps []*nanostorage.StepEnqueuingWithConfig
	for e := range enrollments {
		st := &nanostorage.StepEnqueuingWithConfig{}
		st.WorkflowName, st.InstanceID = "io.stepcollect.bench", fmt.Sprintf("serial-%d", e)
		st.IDs = []string{fmt.Sprintf("SERIAL-%03d", e)}
		for k := range c.Commands {
			st.Commands = append(st.Commands, nanostorage.StepCommandRaw{CommandUUID: fmt.Sprintf("SERIAL-%03d-%d", e, k), RequestType: "DeviceInformation"})
		}
		steps = append(steps, st)
	}
	if err := storeAll(ctx, store, steps); err != nil {
		return nil, err
	}
	if err := Warm(ctx, db, min(c.Pool, 8)); err != nil {
		return nil, err
	}
	res := &Result{Config: c, Errors: map[string]int{}}
	res.Config.DSN, res.N = "", enrollments
	var lat []time.Duration
	start := time.Now()
	for _, st := range steps {
		for _, cmd := range st.Commands {
			t0 := time.Now()
			r, err := store.StoreCommandResponseAndRetrieveCompletedStep(ctx, st.IDs[0], result(cmd.CommandUUID))
			lat = append(lat, time.Since(t0))
			if err != nil {
				res.Errors[errClass(err)]++
			} else if r != nil {
				res.Completed++
			}
		}
	}
	res.WallMS = ms(time.Since(start))
	res.P50MS, res.P99MS = quantiles(lat)
	return res, stranded(ctx, db, res)
}

// RunCancel measures CancelSteps against the large table the driver loaded:
// c.N cancels of one enrollment each, all its steps, one after another,
// then c.N cancels scoped to a workflow. Reports each half's latencies in
// P50/P99 (all) and P50Scoped/P99Scoped.
func RunCancel(ctx context.Context, c Config, db *sql.DB, store nanostorage.Storage) (*Result, error) {
	ids, err := queryStrings(ctx, db, `SELECT enrollment_id FROM id_commands WHERE enrollment_id LIKE 'BULK-%' ORDER BY enrollment_id LIMIT ?`, 2*c.N)
	if err != nil {
		return nil, err
	}
	if len(ids) < 2*c.N {
		return nil, fmt.Errorf("the large table holds %d enrollments; want %d", len(ids), 2*c.N)
	}
	if err := Warm(ctx, db, min(c.Pool, 8)); err != nil {
		return nil, err
	}
	res := &Result{Config: c, Errors: map[string]int{}}
	res.Config.DSN = ""
	var all, scoped []time.Duration
	start := time.Now()
	for i, id := range ids {
		wf := ""
		if i >= c.N {
			wf = "io.stepcollect.bench.bulk"
		}
		t0 := time.Now()
		err := store.CancelSteps(ctx, id, wf)
		if wf == "" {
			all = append(all, time.Since(t0))
		} else {
			scoped = append(scoped, time.Since(t0))
		}
		if err != nil {
			res.Errors[errClass(err)]++
		} else {
			res.Completed++
		}
	}
	res.WallMS = ms(time.Since(start))
	res.P50MS, res.P99MS = quantiles(all)
	res.P50Scoped, res.P99Scoped = quantiles(scoped)
	return res, nil
}

// Quantiles returns the median and the 99th percentile of lat, in ms.
func Quantiles(lat []time.Duration) (p50, p99 float64) { return quantiles(lat) }

func quantiles(lat []time.Duration) (p50, p99 float64) {
	if len(lat) == 0 {
		return 0, 0
	}
	slices.Sort(lat)
	return ms(lat[len(lat)/2]), ms(lat[min(len(lat)-1, len(lat)*99/100)])
}

func stranded(ctx context.Context, db *sql.DB, res *Result) error {
	return db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands)`).
		Scan(&res.Stranded.Steps, &res.Stranded.IDCommands, &res.Stranded.StepCommands)
}

func queryStrings(ctx context.Context, db *sql.DB, q string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
}
