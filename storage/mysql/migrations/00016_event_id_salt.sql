-- The deployment's event id salt. An event id is derived from the event's
-- type, step id and enrollment (events.ID), so that the transaction that
-- writes it can never write it twice and a lost COMMIT answer is settled by
-- looking for it. Step ids are this database's AUTO_INCREMENT: a second
-- deployment, or this one's database made anew, numbers its steps from 1
-- again, and a workflow engine that deduplicates on event_id (as the
-- contract tells it to) would drop their events as already delivered. The
-- salt, random for each database and the same for every process on it,
-- goes into every id.
--
-- Written once, here, by whichever migration runs first (as migration 15's
-- queue namespace: 60 bits of SHA2 of a UUID); a row written without it
-- (EventIDSalt) gets one from the first process that reads it. A database
-- restored from a backup, or copied to make a second deployment, keeps the
-- salt it had: docs/operations.md says when to give it a new one. Events
-- already in the outbox keep the ids they were written with.

-- +goose NO TRANSACTION
-- +goose Up
ALTER TABLE stepcollect_deployment ADD COLUMN event_id_salt BIGINT UNSIGNED NULL;

UPDATE stepcollect_deployment SET event_id_salt = CONV(LEFT(SHA2(UUID(), 256), 15), 16, 10)
WHERE id = 1 AND event_id_salt IS NULL;

-- +goose Down
ALTER TABLE stepcollect_deployment DROP COLUMN event_id_salt;
