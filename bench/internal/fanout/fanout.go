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

// Config is one measurement.
type Config struct {
	Impl     string // label of the implementation under test
	DSN      string // of a migrated, empty database
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
	Retries   int            `json:"retries,omitempty"` // where the implementation counts them
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
	res, err := Run(context.Background(), c, db, store)
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
		if err := store.StoreStep(ctx, step, time.Now()); err != nil {
			return nil, fmt.Errorf("storing step %d: %w", s, err)
		}
		for _, id := range step.IDs {
			for _, cmd := range step.Commands {
				calls = append(calls, call{id, cmd.CommandUUID})
			}
		}
	}
	if err := Warm(ctx, db, c.Pool); err != nil {
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
			r, err := store.StoreCommandResponseAndRetrieveCompletedStep(ctx, cl.id, &nanostorage.StepCommandResult{
				CommandUUID: cl.uuid, RequestType: "DeviceInformation", Completed: true,
				ResultReport: []byte("<?xml version=\"1.0\"?><plist version=\"1.0\"><dict><key>Status</key><string>Acknowledged</string></dict></plist>"),
			})
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
	slices.Sort(lat)
	res.P50MS = ms(lat[len(lat)/2])
	res.P99MS = ms(lat[min(len(lat)-1, len(lat)*99/100)])

	err := db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands)`).
		Scan(&res.Stranded.Steps, &res.Stranded.IDCommands, &res.Stranded.StepCommands)
	return res, err
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

func errClass(err error) string {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return strconv.Itoa(int(me.Number))
	}
	return "other"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
