-- The deployment's name for its queues in Redis. Every process of one
-- deployment reads the same database, and so the same namespace; two
-- deployments on one Redis database (two test stacks, staging beside
-- production) get different ones, so that neither takes the other's
-- collect tasks, nor its sweep and schedule slots (whose TaskIDs name only
-- the time). Before this, the queues were named "stepcollect" and
-- "stepcollect_sweep" everywhere.
--
-- The value is written once, here, by whichever migration runs first, and
-- every process reads the same one (SHA2 of a UUID: MySQL 9 has no MD5). A
-- database copied to make a second deployment keeps the namespace of the
-- first; give the copy its own if the two share a Redis database
-- (docs/operations.md).

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS stepcollect_deployment (
    id              TINYINT     NOT NULL PRIMARY KEY,
    queue_namespace VARCHAR(32) NOT NULL
) DEFAULT CHARSET=utf8mb4;

INSERT IGNORE INTO stepcollect_deployment (id, queue_namespace) VALUES (1, LEFT(SHA2(UUID(), 256), 16));

-- +goose Down
DROP TABLE IF EXISTS stepcollect_deployment;
