// Copied from NanoCMD v0.7.1's cmd/nanocmd/workflows.go:
//
// Copyright 2023 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanocmd, LICENSE).

package nanocmdapp

import (
	"context"
	"errors"
	"fmt"

	storageprof "github.com/micromdm/nanocmd/subsystem/profile/storage"
	"github.com/micromdm/nanocmd/workflow"
	"github.com/micromdm/nanocmd/workflow/certprof"
	"github.com/micromdm/nanocmd/workflow/cmdplan"
	"github.com/micromdm/nanocmd/workflow/devinfolog"
	"github.com/micromdm/nanocmd/workflow/fvenable"
	"github.com/micromdm/nanocmd/workflow/fvrotate"
	"github.com/micromdm/nanocmd/workflow/inventory"
	"github.com/micromdm/nanocmd/workflow/lock"
	"github.com/micromdm/nanocmd/workflow/profile"

	"github.com/micromdm/nanolib/log"
)

type registerer interface {
	RegisterWorkflow(w workflow.Workflow) error
}

// registerWorkflows registers every workflow of NanoCMD v0.7.1, in its order.
func registerWorkflows(logger log.Logger, r registerer, s *storageConfig, e workflow.StepEnqueuer) error {
	var w workflow.Workflow
	var err error

	if w, err = inventory.New(e, s.inventory); err != nil {
		return fmt.Errorf("creating inventory workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering inventory workflow: %w", err)
	}

	if w, err = profile.New(e, s.profile, profile.WithLogger(logger)); err != nil {
		return fmt.Errorf("creating profile workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering profile workflow: %w", err)
	}

	if w, err = fvenable.New(e, s.filevault, fvenableProfiles{s.profile}, fvenable.WithLogger(logger)); err != nil {
		return fmt.Errorf("creating fvenable workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering fvenable workflow: %w", err)
	}

	if w, err = fvrotate.New(e, s.filevault, fvrotate.WithLogger(logger)); err != nil {
		return fmt.Errorf("creating fvrotate workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering fvrotate workflow: %w", err)
	}

	if w, err = cmdplan.New(e, s.cmdplan, s.profile, cmdplan.WithLogger(logger)); err != nil {
		return fmt.Errorf("creating cmdplan workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering cmdplan workflow: %w", err)
	}

	if w, err = lock.New(e, s.inventory, lock.WithLogger(logger)); err != nil {
		return fmt.Errorf("creating lock workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering lock workflow: %w", err)
	}

	if w, err = certprof.New(e, s.profile, certprof.WithLogger(logger)); err != nil {
		return fmt.Errorf("creating certprof workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering certprof workflow: %w", err)
	}

	if w, err = devinfolog.New(e, logger); err != nil {
		return fmt.Errorf("creating devinfolog workflow: %w", err)
	} else if err = r.RegisterWorkflow(w); err != nil {
		return fmt.Errorf("registering devinfolog workflow: %w", err)
	}

	return nil
}

// fvenableProfiles is the profile store as the fvenable workflow reads it:
// its own template missing from the store is no error, so that the
// workflow falls back to its built-in template, as NanoCMD's operations
// guide says it does. v0.7.1's fvenable stops at the ErrProfileNotFound
// every profile storage returns for a missing name (and the template it
// serves cannot be uploaded: its __CERTIFICATE__ placeholder is not
// base64), so without this no fvenable could start.
type fvenableProfiles struct{ storageprof.ReadStorage }

func (p fvenableProfiles) RetrieveRawProfiles(ctx context.Context, names []string) (map[string][]byte, error) {
	raw, err := p.ReadStorage.RetrieveRawProfiles(ctx, names)
	if len(names) == 1 && names[0] == fvenable.WorkflowName && errors.Is(err, storageprof.ErrProfileNotFound) {
		return nil, nil
	}
	return raw, err
}
