-- Two of the outbox's indexes are read by no query: (created_at), from the
-- first outbox, and (lease_until), which the claim stopped using when it
-- went through outbox_held_at (its NULL entries are in id order). Every
-- event paid for both four times: its INSERT, the worker's lease UPDATE
-- (lease_until moves, so its entry is deleted and written again), the
-- acknowledging DELETE and the purge after it.

-- +goose Up
ALTER TABLE stepcollect_outbox DROP INDEX outbox_created_at, DROP INDEX outbox_lease_until;

-- +goose Down
ALTER TABLE stepcollect_outbox ADD INDEX outbox_created_at (created_at), ADD INDEX outbox_lease_until (lease_until);
