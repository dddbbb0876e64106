-- A completion's receipt, for a storage without the outbox (WithReceipts:
-- cmd/nanocmd, whose engine is told of a completion in the webhook's own
-- request): written in the completion's transaction, it is the evidence a
-- COMMIT whose answer was lost is settled by (docs/design.md, "How a result
-- is committed"), and pruned once no retry can still ask for it. Keyed by
-- step and enrollment, so that a fan-out's receipts go in key order.

-- +goose Up
CREATE TABLE IF NOT EXISTS stepcollect_receipts (
    step_id       BIGINT       NOT NULL,
    enrollment_id VARCHAR(255) NOT NULL,
    created_at    TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
    PRIMARY KEY (step_id, enrollment_id),
    KEY receipts_created_at (created_at)
) DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE IF EXISTS stepcollect_receipts;
