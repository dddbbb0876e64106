-- What operators ask of steps (GET /v1/steps, docs/reference.md): how many
-- enrollments a step was sent to (id_commands rows go as each finishes, so
-- the count is kept with the step, written by StoreStep; NULL for a step
-- stored before this migration or by NanoCMD itself), and indexes for the
-- list, oldest first, by workflow and by instance.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE steps
    ADD COLUMN stepcollect_ids INT NULL,
    ADD INDEX steps_created_at (created_at),
    ADD INDEX steps_workflow_created_at (workflow_name, created_at),
    ADD INDEX steps_instance_workflow_created_at (instance_id, workflow_name, created_at);

-- +goose Down
ALTER TABLE steps
    DROP INDEX steps_instance_workflow_created_at,
    DROP INDEX steps_workflow_created_at,
    DROP INDEX steps_created_at,
    DROP COLUMN stepcollect_ids;
