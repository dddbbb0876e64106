-- Three of id_commands' indexes from NanoCMD's schema are read by no query
-- of stepcollect's, and every result pays for them: (enrollment_id)
-- repeats the primary key's first column; (command_uuid) is never looked
-- up without the enrollment, whose primary key serves; (completed), two
-- values over the whole table, changes with every result stored. Each
-- goes with every row a completion releases. Dropping them takes half the
-- secondary-index writes off a result (docs/benchmarks.md). NanoCMD's own
-- server still runs on the table without them: its queries by enrollment
-- and command use the primary key too.

-- +goose Up
ALTER TABLE id_commands DROP INDEX enrollment_id, DROP INDEX command_uuid, DROP INDEX completed;

-- +goose Down
ALTER TABLE id_commands ADD INDEX enrollment_id (enrollment_id), ADD INDEX command_uuid (command_uuid), ADD INDEX completed (completed);
