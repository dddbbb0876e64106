-- The outbox: every event for the workflow engine is written here in the
-- same transaction as the state change that caused it, and deleted once a
-- delivery is acknowledged. Self-contained (no foreign key to steps): the
-- step may be collected long before its events are delivered.

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS stepcollect_outbox (
    id            BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
    event_id      VARCHAR(64)  NOT NULL,
    event_type    VARCHAR(32)  NOT NULL,
    step_id       BIGINT       NOT NULL,
    enrollment_id VARCHAR(255) NULL,
    payload       LONGBLOB     NOT NULL,
    created_at    TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    attempts      INT          NOT NULL DEFAULT 0,
    last_error    VARCHAR(1000) NULL,

    UNIQUE KEY outbox_event_id (event_id),
    KEY outbox_created_at (created_at)
) DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE IF EXISTS stepcollect_outbox;
