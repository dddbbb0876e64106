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

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// bundle is what most tests need: a migrated database of their own and a
// storage on it (its sessions at READ COMMITTED, as OpenDB sets them).
type bundle struct {
	db    *testkit.DB
	store *mysql.Storage
	obs   *countingObserver
}

type setupOpts struct {
	sink    storage.ReleaseSink
	db      *testkit.DB // reuse instead of creating
	migrate bool        // migrate db (one made another way)
	extra   []mysql.Option
}

func setup(t testing.TB, o *setupOpts) *bundle {
	t.Helper()
	if o == nil {
		o = &setupOpts{}
	}
	db := o.db.OrNew(t)
	if o.migrate {
		if err := mysql.Migrate(context.Background(), db.DB); err != nil {
			t.Fatal(err)
		}
	}
	obs := newCountingObserver()
	opts := []mysql.Option{
		mysql.WithObserver(obs),
		mysql.WithLogger(zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)),
	}
	if o.sink != nil {
		opts = append(opts, mysql.WithReleaseSink(o.sink))
	}
	s := testkit.OpenStorage(t, db.DB, append(opts, o.extra...)...)
	return &bundle{db: db, store: s, obs: obs}
}

// stored is testkit.FanOut(prefix, n, cmds), stored.
func (b *bundle) stored(t *testing.T, prefix string, n, cmds int) *nanostorage.StepEnqueuingWithConfig {
	t.Helper()
	step := testkit.FanOut(prefix, n, cmds)
	if err := b.store.StoreStep(t.Context(), step, time.Now()); err != nil {
		t.Fatalf("storing step %s: %v", prefix, err)
	}
	return step
}

// answer stores enrollment i's completed result for command c of step.
func (b *bundle) answer(ctx context.Context, step *nanostorage.StepEnqueuingWithConfig, i, c int) (*nanostorage.StepResult, error) {
	return b.store.StoreCommandResponseAndRetrieveCompletedStep(ctx, step.IDs[i], testkit.CommandResult(step.Commands[c].CommandUUID))
}

// enrollmentRows counts the id_commands rows enrollment id still holds.
func (b *bundle) enrollmentRows(t *testing.T, id string) int {
	t.Helper()
	return testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM id_commands WHERE enrollment_id = ?`, id)
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

func countRows(t *testing.T, db *sql.DB) testkit.StepRows { return testkit.CountStepRows(t, db) }

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
	// collections counts StepsCollected calls: one per collection run
	// (a check and the claims that follow it).
	collections int
	setAside    map[string]int
}

func newCountingObserver() *countingObserver {
	o := &countingObserver{mu: make(chan struct{}, 1), retries: map[string]int{}, collected: storage.CollectResult{}, setAside: map[string]int{}}
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
	o.collections++
	for k, v := range res {
		o.collected[k] += v
	}
}

func (o *countingObserver) collectionRuns() int {
	o.lock()
	defer o.unlock()
	return o.collections
}

func (o *countingObserver) EventSetAside(typ string) {
	o.lock()
	defer o.unlock()
	o.setAside[typ]++
}

func (o *countingObserver) setAsideCount(typ string) int {
	o.lock()
	defer o.unlock()
	return o.setAside[typ]
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
