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
	task, _, err := tasks.NewCollectTask([]storage.ReleasedStep{{ID: 7, ObservedAt: at}, {ID: 9}})
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
	task, _, err := tasks.NewCollectTask([]storage.ReleasedStep{{ID: 7, ObservedAt: at}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(task.Payload()), `{"v":1,"steps":[{"id":7,"observed_at":"2026-11-29T12:00:00Z"}]}`; got != want {
		t.Errorf("collect payload\n got %s\nwant %s", got, want)
	}
	for _, mk := range []func(time.Time, time.Duration) (*asynq.Task, []asynq.Option, error){tasks.NewSweepTask, tasks.NewScheduleTask} {
		task, _, err = mk(at, time.Minute)
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
