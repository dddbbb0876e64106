package mysql_test

import (
	"context"
	"database/sql"
	"os"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/testdb"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// bundle is what most tests need: a migrated database of their own and a
// storage on it running its transactions at READ COMMITTED.
type bundle struct {
	db    *testdb.DB
	store *mysql.Storage
	obs   *countingObserver
}

type setupOpts struct {
	collector storage.Collector
	db        *testdb.DB // reuse instead of creating
	noMigrate bool
	extra     []mysql.Option
}

func setup(t *testing.T, o *setupOpts) *bundle {
	t.Helper()
	if o == nil {
		o = &setupOpts{}
	}
	db := o.db
	if db == nil {
		db = testdb.New(t, nil)
	}
	if !o.noMigrate {
		if err := mysql.Migrate(context.Background(), db.DB); err != nil {
			t.Fatal(err)
		}
	}
	obs := newCountingObserver()
	opts := []mysql.Option{
		mysql.WithDB(db.DB),
		mysql.WithIsolation(sql.LevelReadCommitted),
		mysql.WithObserver(obs),
		mysql.WithLogger(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)),
	}
	if o.collector != nil {
		opts = append(opts, mysql.WithCollector(o.collector))
	}
	s, err := mysql.New(append(opts, o.extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return &bundle{db: db, store: s, obs: obs}
}

// loadNanoCMDSchema creates NanoCMD v0.7.1's tables exactly as its
// schema.sql does, as if NanoCMD had made the database.
func loadNanoCMDSchema(t *testing.T, db *sql.DB) {
	t.Helper()
	b, err := os.ReadFile("testdata/nanocmd-v0.7.1-schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	for _, stmt := range strings.Split(string(b), ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := db.Exec(stmt); err != nil {
			t.Fatalf("NanoCMD schema: %v", err)
		}
	}
}

type rowCounts = testdb.StepRows

func countRows(t *testing.T, db *sql.DB) rowCounts { return testdb.CountStepRows(t, db) }

// fanOutStep is a step of one command per enrollment, to n enrollments.
func fanOutStep(prefix string, n, cmds int) *nanostorage.StepEnqueuingWithConfig {
	step := &nanostorage.StepEnqueuingWithConfig{}
	step.WorkflowName = "io.stepcollect.test." + prefix
	step.InstanceID = prefix + "-instance"
	step.Name = "step"
	step.Context = []byte("ctx-" + prefix)
	for i := range n {
		step.IDs = append(step.IDs, enrollmentID(prefix, i))
	}
	for c := range cmds {
		step.Commands = append(step.Commands, nanostorage.StepCommandRaw{
			CommandUUID: commandUUID(prefix, c), RequestType: "DeviceInformation", Command: []byte("<plist/>"),
		})
	}
	return step
}

func enrollmentID(prefix string, i int) string { return prefix + "-ID-" + pad(i) }
func commandUUID(prefix string, c int) string  { return prefix + "-UUID-" + pad(c) }

func pad(i int) string {
	s := "00000" + itoa(i)
	return s[len(s)-5:]
}

func itoa(i int) string {
	if i < 10 {
		return string(rune('0' + i))
	}
	return itoa(i/10) + string(rune('0'+i%10))
}

func result(uuid string) *nanostorage.StepCommandResult {
	return &nanostorage.StepCommandResult{CommandUUID: uuid, Completed: true, ResultReport: []byte("<plist>" + uuid + "</plist>")}
}

// startTogether runs fn(i) for i in [0,n) in n goroutines released at the
// same moment, and waits for all of them.
func startTogether(n int, fn func(i int)) {
	ready := make(chan struct{})
	done := make(chan struct{}, n)
	for i := range n {
		go func() {
			<-ready
			fn(i)
			done <- struct{}{}
		}()
	}
	close(ready)
	for range n {
		<-done
	}
}

// countingObserver records what the storage reports.
type countingObserver struct {
	mu        chan struct{}
	retries   map[string]int
	collected storage.CollectResult
}

func newCountingObserver() *countingObserver {
	o := &countingObserver{mu: make(chan struct{}, 1), retries: map[string]int{}, collected: storage.CollectResult{}}
	return o
}

func (o *countingObserver) lock()   { o.mu <- struct{}{} }
func (o *countingObserver) unlock() { <-o.mu }

func (o *countingObserver) TxRetried(op, reason string) {
	o.lock()
	defer o.unlock()
	o.retries[op+"/"+reason]++
}

func (o *countingObserver) ResultCommitted(time.Duration, bool, error) {}

func (o *countingObserver) StepsCollected(res storage.CollectResult, _ []time.Time) {
	o.lock()
	defer o.unlock()
	for k, v := range res {
		o.collected[k] += v
	}
}

func (o *countingObserver) snapshot() (map[string]int, storage.CollectResult) {
	o.lock()
	defer o.unlock()
	r := map[string]int{}
	for k, v := range o.retries {
		r[k] = v
	}
	c := storage.CollectResult{}
	for k, v := range o.collected {
		c[k] = v
	}
	return r, c
}
