-- Operators' control of delivery (docs/reference.md, "The outbox"):
-- an event that failed -max-delivery-attempts times, or outlived
-- -max-delivery-age, is held (held_at) and not retried until released;
-- a release restarts its count and its age (released_at). retry_at is set
-- while a failed event waits out its backoff, so that "deliver now" can
-- tell a wait from a delivery in flight. The claim reads through
-- outbox_held_at (held_at IS NULL, in id order), so held events are never
-- scanned. stepcollect_delivery is one row: delivery paused or running,
-- for every worker.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE stepcollect_outbox
    ADD COLUMN held_at     TIMESTAMP(6) NULL,
    ADD COLUMN released_at TIMESTAMP(6) NULL,
    ADD COLUMN retry_at    TIMESTAMP(6) NULL,
    ADD KEY outbox_held_at (held_at);

CREATE TABLE IF NOT EXISTS stepcollect_delivery (
    id     TINYINT      NOT NULL PRIMARY KEY,
    paused TINYINT      NOT NULL DEFAULT 0,
    since  TIMESTAMP(6) NULL
) DEFAULT CHARSET=utf8mb4;

INSERT IGNORE INTO stepcollect_delivery (id, paused, since) VALUES (1, 0, NULL);

-- +goose Down
DROP TABLE IF EXISTS stepcollect_delivery;
ALTER TABLE stepcollect_outbox DROP KEY outbox_held_at, DROP COLUMN held_at,
    DROP COLUMN released_at, DROP COLUMN retry_at;
