// Package logkeys holds the zerolog field names stepcollect logs with, so
// that every package spells them the same way and operators can query them.
package logkeys

const (
	RequestID    = "request_id"
	EnrollmentID = "enrollment_id"
	CommandUUID  = "command_uuid"
	StepID       = "step_id"
	StepIDs      = "step_ids"
	WorkflowName = "workflow_name"
	InstanceID   = "instance_id"
	Op           = "op"
	Attempt      = "attempt"
	Reason       = "reason"
	Count        = "count"
	OutboxID     = "outbox_id"
	EventID      = "event_id"
	EventType    = "event_type"
	Topic        = "topic"
)
