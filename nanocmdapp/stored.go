package nanocmdapp

import (
	"context"

	"github.com/micromdm/nanocmd/engine/storage"
	"github.com/micromdm/nanocmd/logkeys"
	"github.com/micromdm/nanocmd/mdm/foss"
	"github.com/micromdm/nanocmd/workflow"
	"github.com/micromdm/nanolib/log"
	"github.com/micromdm/nanolib/log/ctxlog"

	"github.com/stepcollect/stepcollect/metrics"
)

// A webhook's status says whether its result was stored: NanoCMD's engine
// answers 500 when a workflow fails on a step the result completed, after
// the commit, and NanoMDM logs a failed webhook for a result that is kept.

// resultMark is what one webhook learns of its result's commit.
type resultMark struct {
	stored             bool
	workflow, instance string
	step               string
}

type markKey struct{}

// markingStorage is the engine's storage, noting in a webhook's context
// that its result was committed and which step it completed.
type markingStorage struct{ storage.AllStorage }

func (m markingStorage) StoreCommandResponseAndRetrieveCompletedStep(ctx context.Context, id string, sc *storage.StepCommandResult) (*storage.StepResult, error) {
	res, err := m.AllStorage.StoreCommandResponseAndRetrieveCompletedStep(ctx, id, sc)
	if mk, ok := ctx.Value(markKey{}).(*resultMark); ok && err == nil {
		mk.stored = true
		if res != nil {
			mk.workflow, mk.instance, mk.step = res.WorkflowName, res.InstanceID, res.Name
		}
	}
	return res, err
}

// storedAnswers answers a result the storage committed as handled, logging
// and counting a failure of the workflow after it.
type storedAnswers struct {
	foss.MDMEventReceiver
	metrics *metrics.MDM
	logger  log.Logger
}

func (s storedAnswers) MDMCommandResponseEvent(ctx context.Context, id, uuid string, raw []byte, mdmCtx *workflow.MDMContext) error {
	mk := &resultMark{}
	err := s.MDMEventReceiver.MDMCommandResponseEvent(context.WithValue(ctx, markKey{}, mk), id, uuid, raw, mdmCtx)
	if err == nil || !mk.stored {
		return err
	}
	s.metrics.WorkflowFailed(mk.workflow)
	ctxlog.Logger(ctx, s.logger).Info(logkeys.Message, "result stored; its workflow failed on the completed step",
		logkeys.EnrollmentID, id, logkeys.CommandUUID, uuid, logkeys.WorkflowName, mk.workflow,
		logkeys.InstanceID, mk.instance, logkeys.StepName, mk.step, logkeys.Error, err)
	return nil
}
