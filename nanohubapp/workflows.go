// Derived from NanoHUB v0.2.0's cmd/nanohub/workflows.go:
//
// Copyright 2025 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanohub, LICENSE).

package nanohubapp

import (
	"context"
	"errors"
	"fmt"

	stgprof "github.com/micromdm/nanocmd/subsystem/profile/storage"
	"github.com/micromdm/nanocmd/workflow"
	"github.com/micromdm/nanocmd/workflow/certprof"
	"github.com/micromdm/nanocmd/workflow/cmdplan"
	"github.com/micromdm/nanocmd/workflow/devinfolog"
	"github.com/micromdm/nanocmd/workflow/fvenable"
	"github.com/micromdm/nanocmd/workflow/fvrotate"
	"github.com/micromdm/nanocmd/workflow/inventory"
	"github.com/micromdm/nanocmd/workflow/lock"
	"github.com/micromdm/nanocmd/workflow/profile"
	"github.com/micromdm/nanohub/nanohub"
	"github.com/micromdm/nanolib/log"
)

// workflows are NanoHUB's workflow options, in its order; every storage
// (-storage mysql too) has every subsystem, so all eight are registered.
func workflows(logger log.Logger, s *stores) []nanohub.Option {
	wf := func(name string, fn func(e workflow.StepEnqueuer) (workflow.Workflow, error)) nanohub.Option {
		return nanohub.WithWorkflow(func(e workflow.StepEnqueuer) (workflow.Workflow, error) {
			w, err := fn(e)
			if err != nil {
				return nil, fmt.Errorf("creating %s workflow: %w", name, err)
			}
			return w, nil
		})
	}
	return []nanohub.Option{
		wf("inventory", func(e workflow.StepEnqueuer) (workflow.Workflow, error) { return inventory.New(e, s.inventory) }),
		wf("lock", func(e workflow.StepEnqueuer) (workflow.Workflow, error) {
			return lock.New(e, s.inventory, lock.WithLogger(logger))
		}),
		wf("profile", func(e workflow.StepEnqueuer) (workflow.Workflow, error) {
			return profile.New(e, s.profile, profile.WithLogger(logger))
		}),
		wf("certprof", func(e workflow.StepEnqueuer) (workflow.Workflow, error) {
			return certprof.New(e, s.profile, certprof.WithLogger(logger))
		}),
		wf("fvenable", func(e workflow.StepEnqueuer) (workflow.Workflow, error) {
			return fvenable.New(e, s.filevault, fvenableProfiles{s.profile}, fvenable.WithLogger(logger))
		}),
		wf("fvrotate", func(e workflow.StepEnqueuer) (workflow.Workflow, error) {
			return fvrotate.New(e, s.filevault, fvrotate.WithLogger(logger))
		}),
		wf("cmdplan", func(e workflow.StepEnqueuer) (workflow.Workflow, error) {
			return cmdplan.New(e, s.cmdplan, s.profile, cmdplan.WithLogger(logger))
		}),
		wf("devinfolog", func(e workflow.StepEnqueuer) (workflow.Workflow, error) { return devinfolog.New(e, logger) }),
	}
}

// fvenableProfiles is the profile store as the fvenable workflow reads it:
// its own template missing is no error, so that it falls back to its
// built-in one (copied from nanocmdapp/workflows.go, which says why).
type fvenableProfiles struct{ stgprof.ReadStorage }

func (p fvenableProfiles) RetrieveRawProfiles(ctx context.Context, names []string) (map[string][]byte, error) {
	raw, err := p.ReadStorage.RetrieveRawProfiles(ctx, names)
	if len(names) == 1 && names[0] == fvenable.WorkflowName && errors.Is(err, stgprof.ErrProfileNotFound) {
		return nil, nil
	}
	return raw, err
}
