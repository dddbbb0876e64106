package nanocmdapp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"sync"
	"time"

	"github.com/micromdm/nanocmd/logkeys"
	"github.com/micromdm/nanocmd/utils/uuid"
	"github.com/micromdm/nanocmd/workflow"
	"github.com/micromdm/nanolib/log"
	"github.com/micromdm/nanolib/log/ctxlog"
	"golang.org/x/sync/errgroup"
)

// splitParallel is how many of one fan-out's steps are stored and enqueued
// at once.
const splitParallel = 4

// splitSteps is the step enqueuer the workflows are given, in front of the
// engine: a step whose ids do not fit one enqueue request becomes several
// steps of the same instance, each with its own command UUIDs, so that each
// command goes to the MDM server in one request (NanoMDM refuses a command
// UUID it has stored). The ids a command was not enqueued for have their
// step cancelled and are named in the error. docs/design.md, "Fan-outs
// through NanoMDM".
type splitSteps struct {
	engine workflow.StepEnqueuer
	api    *mdmAPI
	// cancel cancels id's steps of a workflow (the engine storage's CancelSteps)
	cancel func(ctx context.Context, id, workflowName string) error
	// wholeStep: cancel removes a step for all of its ids (NanoCMD's own
	// inmem and file storages), so one refused id cancels its step's others
	wholeStep bool
	ider      uuid.IDer
	logger    log.Logger
}

func (s *splitSteps) EnqueueStep(ctx context.Context, n workflow.Namer, se *workflow.StepEnqueueing) error {
	groups := s.api.groups(se.IDs)
	if len(groups) <= 1 {
		failed, err := s.enqueue(ctx, n, se)
		return stepError(failed, len(se.IDs), []error{err})
	}
	steps := make([]*workflow.StepEnqueueing, len(groups))
	for i, ids := range groups {
		step := *se
		step.IDs = ids
		if i > 0 {
			cmds, err := s.renamed(se.Commands)
			if err != nil {
				return fmt.Errorf("splitting step %q of %s (%d ids): %w", se.Name, n.Name(), len(se.IDs), err)
			}
			step.Commands = cmds
		}
		steps[i] = &step
	}
	ctxlog.Logger(ctx, s.logger).Debug(logkeys.Message, "splitting step", logkeys.WorkflowName, n.Name(),
		logkeys.InstanceID, se.InstanceID, logkeys.GenericCount, len(se.IDs), "steps", len(steps))
	var (
		mu     sync.Mutex
		failed = map[string]string{}
		errs   []error
		g      errgroup.Group
	)
	g.SetLimit(splitParallel)
	for _, step := range steps {
		g.Go(func() error {
			f, err := s.enqueue(ctx, n, step)
			mu.Lock()
			defer mu.Unlock()
			maps.Copy(failed, f)
			errs = append(errs, err)
			return nil
		})
	}
	g.Wait()
	return stepError(failed, len(se.IDs), errs)
}

// enqueue stores and enqueues one step through the engine, then cancels it
// for the ids the MDM server did not take a command for. It returns those
// ids, and any other failure (storing the step, cancelling it).
func (s *splitSteps) enqueue(ctx context.Context, n workflow.Namer, se *workflow.StepEnqueueing) (map[string]string, error) {
	rctx, report := withEnqueueReport(ctx)
	err := s.engine.EnqueueStep(rctx, n, se)
	if len(report.failed) == 0 {
		// nil, or nothing stored (the step is stored whole or not at all)
		return nil, err
	}
	if s.wholeStep {
		for _, id := range se.IDs {
			if _, ok := report.failed[id]; !ok {
				report.failed[id] = "cancelled with its step's refused ids: NanoCMD's " + "storage cancels a step for all its ids"
			}
		}
	}
	// the caller may have gone: the steps are cancelled all the same
	cctx, done := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer done()
	var cancelErrs []error
	for id := range report.failed {
		if err := s.cancel(cctx, id, n.Name()); err != nil {
			cancelErrs = append(cancelErrs, err)
		}
	}
	ctxlog.Logger(ctx, s.logger).Info(logkeys.Message, "enqueueing step: cancelled for the ids not enqueued",
		logkeys.WorkflowName, n.Name(), logkeys.InstanceID, se.InstanceID, logkeys.StepName, se.Name,
		logkeys.GenericCount, len(report.failed), logkeys.Error, describeFailures(report.failed))
	if len(cancelErrs) > 0 {
		return report.failed, &cancelError{errors.Join(cancelErrs...)}
	}
	return report.failed, nil
}

// stepError is one error for a fan-out's steps: the ids the MDM server did
// not take, all of them named and counted, then any other failure.
func stepError(failed map[string]string, total int, errs []error) error {
	var out []error
	if len(failed) > 0 {
		var ce *cancelError
		out = append(out, &EnqueueError{Failed: failed, Of: total, Cancelled: !errors.As(errors.Join(errs...), &ce)})
	}
	return errors.Join(append(out, errs...)...)
}

// renamed copies cmds, each with a new CommandUUID (every mdmcommands
// command is a pointer to a struct with that string field).
func (s *splitSteps) renamed(cmds []interface{}) ([]interface{}, error) {
	out := make([]interface{}, len(cmds))
	for i, c := range cmds {
		v := reflect.ValueOf(c)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return nil, fmt.Errorf("command %d is a %T, not a pointer to a command struct", i, c)
		}
		cp := reflect.New(v.Elem().Type())
		cp.Elem().Set(v.Elem())
		f := cp.Elem().FieldByName("CommandUUID")
		if !f.IsValid() || f.Kind() != reflect.String || !f.CanSet() {
			return nil, fmt.Errorf("command %d (%T) has no CommandUUID to give its own", i, c)
		}
		f.SetString(s.ider.ID())
		out[i] = cp.Interface()
	}
	return out, nil
}

// cancelError is a failure to cancel the steps of ids not enqueued.
type cancelError struct{ err error }

func (e *cancelError) Error() string {
	return "cancelling their steps (they wait for their timeout): " + e.err.Error()
}
func (e *cancelError) Unwrap() error { return e.err }
