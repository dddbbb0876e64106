-- A command, its result and a step's context are bytes, not text: a device
-- may answer with a binary plist, and an engine's context is whatever it
-- chose to keep (NanoCMD reads all three into []byte). In NanoCMD's schema
-- they are utf8mb4 MEDIUMTEXT, so the server refused any of them that was
-- not UTF-8 ("Incorrect string value"): a binary plist result of a step
-- with another command outstanding got a 400, and NanoMDM does not send a
-- result twice. MEDIUMBLOB holds every value MEDIUMTEXT did, byte for byte,
-- with the same 16 MiB limit, and NanoCMD itself reads it as before.
--
-- Changing a column's character set copies the table: on a large
-- id_commands, writes to it wait until this is done (docs/operations.md).

-- +goose Up
ALTER TABLE id_commands MODIFY result MEDIUMBLOB NULL;
ALTER TABLE step_commands MODIFY command MEDIUMBLOB NOT NULL;
ALTER TABLE steps MODIFY context MEDIUMBLOB NULL;

-- +goose Down
-- Fails where a value is not UTF-8, which is what the Up allowed.
ALTER TABLE steps MODIFY context MEDIUMTEXT NULL;
ALTER TABLE step_commands MODIFY command MEDIUMTEXT NOT NULL;
ALTER TABLE id_commands MODIFY result MEDIUMTEXT NULL;
