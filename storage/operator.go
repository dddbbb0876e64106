package storage

import "time"

// StepSummary is one row of GET /v1/steps: a step that still exists.
type StepSummary struct {
	StepID       int64  `json:"step_id"`
	WorkflowName string `json:"workflow_name"`
	InstanceID   string `json:"instance_id"`
	StepName     string `json:"step_name"`
	// CreatedAt is nil for a row that has none: written outside
	// stepcollect and NanoCMD, whose inserts take the column's default.
	CreatedAt *time.Time `json:"created_at"`
	NotUntil  *time.Time `json:"not_until"`
	Timeout   *time.Time `json:"timeout"`
	// IDs is how many enrollments the step was stored for; nil for a step
	// stored before stepcollect kept the count (or by NanoCMD itself).
	IDs *int `json:"ids"`
	// OutstandingIDs is how many enrollments have not finished it.
	OutstandingIDs int `json:"outstanding_ids"`
}

// StepCursor is where a page of steps ended: steps are listed oldest
// first, by creation time and then id; those without a creation time
// (CreatedAt nil) first of all, by id.
type StepCursor struct {
	CreatedAt *time.Time
	ID        int64
}

// StepFilter selects and pages GET /v1/steps.
type StepFilter struct {
	WorkflowName string        // "": any
	InstanceID   string        // "": any
	OlderThan    time.Duration // 0: any age; else created at least this long ago, by the database's clock
	After        *StepCursor   // nil: from the oldest
	Limit        int
}
