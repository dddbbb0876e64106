package scheduler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/scheduler"
	"github.com/stepcollect/stepcollect/storage"
	"github.com/stepcollect/stepcollect/tasks"
)

type fakeStore struct {
	due, timedOut  int
	dueErr, toErr  error
	dueAt, timedAt time.Time
}

func (f *fakeStore) SendDueSteps(_ context.Context, now time.Time) (int, error) {
	f.dueAt = now
	return f.due, f.dueErr
}
func (f *fakeStore) TimeOutSteps(_ context.Context, now time.Time) (int, error) {
	f.timedAt = now
	return f.timedOut, f.toErr
}

func scheduleTask(t *testing.T) *asynq.Task {
	task, _, err := tasks.NewScheduleTask(tasks.QueueSweep, time.Now().Truncate(time.Second), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return task
}

// One run acts on both, at the same moment, and a failure of either is the
// task's failure (asynq retries it), without keeping the other from running.
func TestAScheduleRunActsOnDueAndTimedOutStepsAndReportsEitherFailure(t *testing.T) {
	t.Parallel()
	st := &fakeStore{due: 1, timedOut: 2}
	s := scheduler.New(time.Second, st, nil, zerolog.Nop())
	if err := s.ProcessTask(t.Context(), scheduleTask(t)); err != nil {
		t.Fatal(err)
	}
	if st.dueAt.IsZero() || !st.dueAt.Equal(st.timedAt) {
		t.Errorf("due at %v, timed out at %v: want one run, one moment", st.dueAt, st.timedAt)
	}
	boom := errors.New("mysql gone")
	st = &fakeStore{dueErr: boom}
	s = scheduler.New(time.Second, st, nil, zerolog.Nop())
	if err := s.ProcessTask(t.Context(), scheduleTask(t)); !errors.Is(err, boom) {
		t.Errorf("run with SendDueSteps failing: %v, want its error", err)
	}
	if st.timedAt.IsZero() {
		t.Error("a failing SendDueSteps kept TimeOutSteps from running")
	}
}

// A payload of an unknown version is refused without retry.
func TestAScheduleTaskOfAnUnknownVersionIsNotRetried(t *testing.T) {
	t.Parallel()
	s := scheduler.New(time.Second, &fakeStore{}, nil, zerolog.Nop())
	err := s.ProcessTask(t.Context(), asynq.NewTask(tasks.TypeSchedule, []byte(`{"v":99}`)))
	if !errors.Is(err, asynq.SkipRetry) {
		t.Errorf("unknown version: %v, want SkipRetry", err)
	}
}

// On a database cmd/nanocmd owns, a run that the storage refused is not a
// failure to retry: NanoCMD's engine worker acts on those steps.
func TestARunOnADatabaseNanoCMDOwnsIsNotAFailure(t *testing.T) {
	t.Parallel()
	st := &fakeStore{dueErr: storage.ErrScheduleOwnedByEngine, toErr: storage.ErrScheduleOwnedByEngine}
	s := scheduler.New(time.Second, st, nil, zerolog.Nop())
	if err := s.ProcessTask(t.Context(), scheduleTask(t)); err != nil {
		t.Errorf("run refused by the storage: %v, want nil (nothing to retry)", err)
	}
}
