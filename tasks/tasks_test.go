package tasks_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/tasks"
)

func TestCollectPayloadRoundTripsWithItsVersion(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	task, _, err := tasks.NewCollectTask(tasks.QueueCollect, []storage.ReleasedStep{{ID: 7, ObservedAt: at}, {ID: 9}})
	if err != nil {
		t.Fatal(err)
	}
	p, err := tasks.ParseCollect(task)
	if err != nil {
		t.Fatal(err)
	}
	if p.Version != tasks.PayloadVersion || len(p.Steps) != 2 || p.Steps[0].ID != 7 || !p.Steps[0].ObservedAt.Equal(at) {
		t.Errorf("round trip: %+v", p)
	}
}

// A sweep slot's TaskID conflict is success (another replica got there
// first). Collect tasks have no TaskID: a duplicate must never be able to
// reject the hand-off that carries a step's last release.
func TestEnqueuerTreatsASlotConflictAsSuccessAndNeverDeduplicatesCollects(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, _ := asynq.ParseRedisURI(rs.URL)
	var failures []string
	e := tasks.NewEnqueuer(opt, tasks.OnEnqueueFailure(func(task string) { failures = append(failures, task) }))
	defer e.Close()
	step := []storage.ReleasedStep{{ID: 42, ObservedAt: time.Now()}}
	for range 3 {
		if err := e.EnqueueCollect(t.Context(), step); err != nil {
			t.Fatal(err)
		}
	}
	slot := time.Now().Truncate(time.Minute)
	for range 3 { // three replicas asking for the same slot
		if err := e.EnqueueSweep(t.Context(), slot, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	collect, _ := insp.ListPendingTasks(tasks.QueueCollect)
	sweeps, _ := insp.ListPendingTasks(tasks.QueueSweep)
	if len(collect) != 3 || len(sweeps) != 1 {
		t.Errorf("pending: %d collect, %d sweep tasks; want 3 and 1", len(collect), len(sweeps))
	}
	if len(failures) != 0 {
		t.Errorf("conflicts counted as failures: %v", failures)
	}
}

func TestEnqueuerFailsFastWhileRedisIsDown(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, _ := asynq.ParseRedisURI(rs.URL)
	var failures int
	e := tasks.NewEnqueuer(opt, tasks.WithCooldown(time.Hour), tasks.OnEnqueueFailure(func(string) { failures++ }))
	defer e.Close()
	rs.Kill()
	step := []storage.ReleasedStep{{ID: 1}}
	if err := e.EnqueueCollect(t.Context(), step); err == nil {
		t.Fatal("enqueue with Redis down succeeded")
	}
	// within the cooldown the enqueuer does not even try
	err := e.EnqueueCollect(t.Context(), step)
	if !errors.Is(err, tasks.ErrRedisCoolingDown) {
		t.Errorf("second enqueue: %v, want ErrRedisCoolingDown", err)
	}
	if failures != 2 {
		t.Errorf("%d failures counted, want 2", failures)
	}
}

// The queue's wire format is pinned: renaming a field anywhere must fail
// here, not silently change what a worker of another build reads.
func TestPayloadWireFormat(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	task, _, err := tasks.NewCollectTask(tasks.QueueCollect, []storage.ReleasedStep{{ID: 7, ObservedAt: at}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(task.Payload()), `{"v":1,"steps":[{"id":7,"observed_at":"2026-11-29T12:00:00Z"}]}`; got != want {
		t.Errorf("collect payload\n got %s\nwant %s", got, want)
	}
	for _, mk := range []func(string, time.Time, time.Duration) (*asynq.Task, []asynq.Option, error){tasks.NewSweepTask, tasks.NewScheduleTask} {
		task, _, err = mk(tasks.QueueSweep, at, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := string(task.Payload()), `{"v":1,"slot":"2026-11-29T12:00:00Z"}`; got != want {
			t.Errorf("%s payload\n got %s\nwant %s", task.Type(), got, want)
		}
	}
	p, err := tasks.ParseCollect(asynq.NewTask(tasks.TypeCollect, []byte(`{"v":1,"steps":[{"id":9,"observed_at":"2026-11-29T12:00:00Z"}]}`)))
	if err != nil || len(p.ReleasedSteps()) != 1 || p.ReleasedSteps()[0].ID != 9 || !p.ReleasedSteps()[0].ObservedAt.Equal(at) {
		t.Errorf("reading a version-1 collect payload: %+v, %v", p, err)
	}
}

// Two deployments on one Redis database keep to their own queues: each
// gets its own sweep and schedule run of a slot (the TaskIDs name only the
// time), and its own collect tasks. An enqueuer whose namespace is not
// known yet enqueues nothing, and counts it as a failure.
func TestNamespacesKeepDeploymentsApartOnOneRedis(t *testing.T) {
	t.Parallel()
	rs := testkit.StartRedis(t)
	opt, _ := asynq.ParseRedisURI(rs.URL)
	a, b := tasks.NamesFor("aaaa"), tasks.NamesFor("bbbb")
	ea := tasks.NewEnqueuer(opt, tasks.WithNamespace(tasks.NewNamespace(a)))
	defer ea.Close()
	eb := tasks.NewEnqueuer(opt, tasks.WithNamespace(tasks.NewNamespace(b)))
	defer eb.Close()
	slot := time.Now().Truncate(time.Minute)
	for _, e := range []*tasks.Enqueuer{ea, eb} {
		if err := e.EnqueueSweep(t.Context(), slot, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := e.EnqueueSchedule(t.Context(), slot, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if err := ea.EnqueueCollect(t.Context(), []storage.ReleasedStep{{ID: 1}}); err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	for _, q := range []struct {
		names        tasks.QueueNames
		collect, all int
	}{{a, 1, 2}, {b, 0, 2}} {
		collect, _ := insp.ListPendingTasks(q.names.Collect)
		slots, _ := insp.ListPendingTasks(q.names.Sweep)
		if len(collect) != q.collect || len(slots) != q.all {
			t.Errorf("%s: %d collect and %d sweep/schedule tasks pending, want %d and %d", q.names.Collect, len(collect), len(slots), q.collect, q.all)
		}
	}
	if bare, err := insp.ListPendingTasks(tasks.QueueCollect); err == nil && len(bare) != 0 {
		t.Errorf("%d tasks on the bare queue %s", len(bare), tasks.QueueCollect)
	}

	ns := tasks.NewNamespace(tasks.QueueNames{})
	var failures int
	eu := tasks.NewEnqueuer(opt, tasks.WithNamespace(ns), tasks.OnEnqueueFailure(func(string) { failures++ }))
	defer eu.Close()
	if err := eu.EnqueueCollect(t.Context(), []storage.ReleasedStep{{ID: 2}}); !errors.Is(err, tasks.ErrNoNamespace) || failures != 1 {
		t.Errorf("enqueue before the namespace is known: %v (%d failures counted), want ErrNoNamespace counted once", err, failures)
	}
	ns.Set(a)
	if err := eu.EnqueueCollect(t.Context(), []storage.ReleasedStep{{ID: 2}}); err != nil {
		t.Errorf("enqueue once the namespace is set: %v", err)
	}
	if collect, _ := insp.ListPendingTasks(a.Collect); len(collect) != 2 {
		t.Errorf("%d collect tasks on %s, want 2", len(collect), a.Collect)
	}
}

func TestQueueNamesLabelOnlyTheirOwnQueues(t *testing.T) {
	t.Parallel()
	q := tasks.NamesFor("abc")
	for name, want := range map[string]string{"stepcollect:abc": "stepcollect", "stepcollect_sweep:abc": "stepcollect_sweep",
		"stepcollect": "", "stepcollect:abd": "", "stepcollect_sweep": ""} {
		if got := q.Label(name); got != want {
			t.Errorf("Label(%q) = %q, want %q", name, got, want)
		}
	}
	if q.Name("stepcollect") != "stepcollect:abc" || q.Name("nope") != "" {
		t.Errorf("Name: %q %q", q.Name("stepcollect"), q.Name("nope"))
	}
	if (tasks.QueueNames{}).Label("") != "" || (tasks.QueueNames{}).Known() {
		t.Error("the zero QueueNames names queues")
	}
}
