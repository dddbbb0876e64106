-- Due and timed-out steps whose event could not be written (too large for
-- the server's max_allowed_packet, or refused for its data): the step's
-- not_until or timeout is cleared so that the scheduler's claims pass over
-- it, and kept here with the reason, so that one bad step never holds back
-- the others and an operator can see it and put it back (docs/runbook.md).

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS stepcollect_set_aside (
    step_id    BIGINT        NOT NULL,
    event_type VARCHAR(32)   NOT NULL,
    was_at     TIMESTAMP(6)  NULL,
    reason     VARCHAR(1000) NOT NULL,
    created_at TIMESTAMP(6)  NOT NULL DEFAULT CURRENT_TIMESTAMP(6),

    PRIMARY KEY (step_id, event_type)
) DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE IF EXISTS stepcollect_set_aside;
