-- A delivery claims its outbox row for a while (lease_until), so that a
-- retry, the sweeper's re-offer and another replica never deliver the same
-- event at the same time, and so that the sweeper can tell a row whose
-- enqueue was lost (no lease, old) from one a delivery is working on.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE stepcollect_outbox
    ADD COLUMN lease_until TIMESTAMP(6) NULL,
    ADD KEY outbox_lease_until (lease_until);

-- +goose Down
ALTER TABLE stepcollect_outbox DROP KEY outbox_lease_until, DROP COLUMN lease_until;
