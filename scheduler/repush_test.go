package scheduler_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/scheduler"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// pushRequest is one request NanoMDM's push API received.
type pushRequest struct {
	method, path, user, key string
	auth                    bool
}

// pushAPI stands in for NanoMDM's push API (GET /v1/push/<id>,<id>,…).
type pushAPI struct {
	*httptest.Server
	mu     sync.Mutex
	reqs   []pushRequest
	status int
}

func newPushAPI(t *testing.T, status int) *pushAPI {
	p := &pushAPI{status: status}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, key, ok := r.BasicAuth()
		p.mu.Lock()
		p.reqs = append(p.reqs, pushRequest{method: r.Method, path: r.URL.Path, user: user, key: key, auth: ok})
		p.mu.Unlock()
		if r.URL.Path == "/elsewhere" {
			return
		}
		if p.status == http.StatusTemporaryRedirect {
			w.Header().Set("Location", "/elsewhere")
		}
		w.WriteHeader(p.status)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *pushAPI) requests() []pushRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reqs)
}

// repushBundle is a migrated database with the worker's storage, a push API
// and a scheduler that re-pushes to it after 24 h.
type repushBundle struct {
	db      *testkit.DB
	store   *stepmysql.Storage
	api     *pushAPI
	metrics *metrics.RePush
	sched   *scheduler.Scheduler
}

func setupRePush(t *testing.T, status int) *repushBundle {
	t.Helper()
	db, store := testkit.NewStorage(t, stepmysql.WithOutbox())
	api := newPushAPI(t, status)
	m := metrics.NewRePush(prometheus.NewRegistry())
	logger := zerolog.New(zerolog.NewTestWriter(t))
	pusher := scheduler.NewPusher(api.URL+"/v1/push/", "push-s3cret", m, logger)
	sched := scheduler.New(time.Second, store, nil, logger,
		scheduler.WithRePush(scheduler.RePush{Interval: 24 * time.Hour, Store: store, Pusher: pusher}))
	return &repushBundle{db: db, store: store, api: api, metrics: m, sched: sched}
}

// storeAt stores step as pushed at pushTime.
func (b *repushBundle) storeAt(t *testing.T, step *nanostorage.StepEnqueuingWithConfig, pushTime time.Time) {
	t.Helper()
	if _, err := b.store.StoreStepID(t.Context(), step, pushTime); err != nil {
		t.Fatal(err)
	}
}

// pushedIDs is every id the push API was asked for, each request checked
// for NanoMDM's shape: GET /v1/push/<ids>, basic auth nanomdm:<key>, at
// most 30 ids.
func pushedIDs(t *testing.T, reqs []pushRequest) []string {
	t.Helper()
	var ids []string
	for _, r := range reqs {
		if r.method != http.MethodGet || !r.auth || r.user != "nanomdm" || r.key != "push-s3cret" {
			t.Errorf("push request %s %s with auth %v %q:%q, want GET with basic auth nanomdm:push-s3cret", r.method, r.path, r.auth, r.user, r.key)
		}
		rest, ok := strings.CutPrefix(r.path, "/v1/push/")
		if !ok {
			t.Errorf("push request to %s, want /v1/push/<ids>", r.path)
			continue
		}
		chunk := strings.Split(rest, ",")
		if len(chunk) > scheduler.PushChunk {
			t.Errorf("push request for %d ids, want at most %d", len(chunk), scheduler.PushChunk)
		}
		ids = append(ids, chunk...)
	}
	slices.Sort(ids)
	return ids
}

// Enrollments whose command went unanswered for longer than the interval
// are pushed through NanoMDM's push API, 30 to a request, and marked: the
// next run pushes none of them again. Enrollments pushed recently, not yet
// sent (not_until) or that answered are not pushed.
func TestUnansweredEnrollmentsAreRePushedInChunksOf30AndOnlyOnce(t *testing.T) {
	t.Parallel()
	b := setupRePush(t, http.StatusOK)
	now := time.Now()
	old := testkit.FanOut("old", 70, 1)
	b.storeAt(t, old, now.Add(-25*time.Hour))
	b.storeAt(t, testkit.FanOut("recent", 5, 1), now.Add(-time.Hour))
	answered := testkit.FanOut("answered", 5, 1)
	b.storeAt(t, answered, now.Add(-25*time.Hour))
	testkit.Complete(t, b.store, answered, answered.IDs...)
	later := testkit.FanOut("later", 5, 1)
	notUntil := now.Add(time.Hour)
	later.NotUntil = notUntil
	b.storeAt(t, later, now.Add(-25*time.Hour))

	if err := b.sched.ProcessTask(t.Context(), scheduleTask(t)); err != nil {
		t.Fatal(err)
	}
	reqs := b.api.requests()
	want := slices.Sorted(slices.Values(old.IDs))
	if got := pushedIDs(t, reqs); !slices.Equal(got, want) {
		t.Errorf("pushed %d ids %v…, want the %d unanswered for over 24 h", len(got), got[:min(3, len(got))], len(want))
	}
	if len(reqs) != 3 {
		t.Errorf("%d push requests, want 3 (30, 30 and 10 ids)", len(reqs))
	}
	if got := testutil.ToFloat64(b.metrics.RePushes.WithLabelValues(metrics.RePushOK)); got != 70 {
		t.Errorf("stepcollect_repushes_total{outcome=\"ok\"} = %v, want 70", got)
	}

	if err := b.sched.ProcessTask(t.Context(), scheduleTask(t)); err != nil {
		t.Fatal(err)
	}
	if again := b.api.requests()[len(reqs):]; len(again) > 0 {
		t.Errorf("the run right after pushed again: %d requests (%v), want none (they were marked)", len(again), pushedIDs(t, again)[:1])
	}
}

// A push the API refuses, or redirects, is counted as http_error (the
// redirect not followed), and the enrollments stay marked: they are pushed
// again one interval later, not at every run.
func TestARefusedPushIsCountedAndTheRedirectNotFollowed(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTemporaryRedirect} {
		b := setupRePush(t, status)
		b.storeAt(t, testkit.FanOut("old", 40, 1), time.Now().Add(-25*time.Hour))
		if err := b.sched.ProcessTask(t.Context(), scheduleTask(t)); err != nil {
			t.Fatal(err)
		}
		reqs := b.api.requests()
		if len(reqs) != 2 {
			t.Errorf("%d: %d requests (%v), want 2 (no redirect followed)", status, len(reqs), reqs)
		}
		if got := testutil.ToFloat64(b.metrics.RePushes.WithLabelValues(metrics.RePushHTTPError)); got != 40 {
			t.Errorf("%d: stepcollect_repushes_total{outcome=\"http_error\"} = %v, want 40", status, got)
		}
		if err := b.sched.ProcessTask(t.Context(), scheduleTask(t)); err != nil {
			t.Fatal(err)
		}
		if n := len(b.api.requests()); n != len(reqs) {
			t.Errorf("%d: the run right after pushed again (%d requests)", status, n-len(reqs))
		}
	}
}

// On a database cmd/nanocmd marked, NanoCMD's engine worker re-pushes: the
// scheduler claims nothing and pushes nothing.
func TestNothingIsRePushedOnADatabaseNanoCMDOwns(t *testing.T) {
	t.Parallel()
	b := setupRePush(t, http.StatusOK)
	b.storeAt(t, testkit.FanOut("old", 10, 1), time.Now().Add(-25*time.Hour))
	if err := b.store.MarkScheduleOwnedByEngine(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := b.sched.ProcessTask(t.Context(), scheduleTask(t)); err != nil {
		t.Errorf("run on a database cmd/nanocmd owns: %v, want nil", err)
	}
	if reqs := b.api.requests(); len(reqs) > 0 {
		t.Errorf("%d push requests, want none", len(reqs))
	}
	// the storage refuses too, for a mark committed after the run's first claims
	if ids, err := b.store.ClaimRePushes(t.Context(), time.Now().Add(-24*time.Hour), time.Now()); !errors.Is(err, storage.ErrScheduleOwnedByEngine) || len(ids) > 0 {
		t.Errorf("ClaimRePushes on a database cmd/nanocmd owns: %d ids, %v, want none and ErrScheduleOwnedByEngine", len(ids), err)
	}
	due := testkit.Count(t, b.db.DB, "SELECT COUNT(*) FROM id_commands WHERE last_push < ?", time.Now().Add(-24*time.Hour))
	if due != 10 {
		t.Errorf("%d commands still due a re-push, want 10 (NanoCMD's engine's to claim)", due)
	}
}

// A push API that does not answer is counted as error, and the run ends.
func TestAPushAPIThatIsDownIsCountedAsError(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	m := metrics.NewRePush(prometheus.NewRegistry())
	p := scheduler.NewPusher(srv.URL+"/v1/push", "k", m, zerolog.New(zerolog.NewTestWriter(t)))
	ids := make([]string, 31)
	for i := range ids {
		ids[i] = testkit.EnrollmentID("down", i)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	if ok := p.Push(ctx, ids); ok != 0 {
		t.Errorf("%d acknowledged by a closed server", ok)
	}
	if got := testutil.ToFloat64(m.RePushes.WithLabelValues(metrics.RePushError)); got != 31 {
		t.Errorf("stepcollect_repushes_total{outcome=\"error\"} = %v, want 31", got)
	}
}

// Enrollments a run claimed but had no time left to push are counted as
// errors, not lost from the count.
func TestIdsLeftWhenTheRunEndsAreCountedAsErrors(t *testing.T) {
	t.Parallel()
	api := newPushAPI(t, http.StatusOK)
	m := metrics.NewRePush(prometheus.NewRegistry())
	p := scheduler.NewPusher(api.URL+"/v1/push/", "k", m, zerolog.New(zerolog.NewTestWriter(t)))
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if ok := p.Push(ctx, make([]string, 45)); ok != 0 || len(api.requests()) != 0 {
		t.Errorf("after the run's end: %d acknowledged, %d requests, want none", ok, len(api.requests()))
	}
	if got := testutil.ToFloat64(m.RePushes.WithLabelValues(metrics.RePushError)); got != 45 {
		t.Errorf("stepcollect_repushes_total{outcome=\"error\"} = %v, want 45", got)
	}
}
