-- Figures that one process measures for all: the sweep's count of
-- unreferenced steps, written by whichever replica ran the sweep and read
-- by every replica at scrape time, so that each exports the same current
-- value (a gauge set in one process's memory is stale in all the others).

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS stepcollect_state (
    name       VARCHAR(64)  NOT NULL PRIMARY KEY,
    value      DOUBLE       NOT NULL,
    updated_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)
) DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE IF EXISTS stepcollect_state;
