-- The commonest predicted completion as a routine of four statements: an
-- enrollment whose step has one command (the reported one, outstanding)
-- and whose evidence is its event. stepcollect_complete_predicted (migration
-- 12) serves every shape, and its loop over the other rows, its counter,
-- its IF tests and its SIGNAL are each an instruction the server runs even
-- where there are no other rows; on MariaDB with its binary log on that made
-- it cost the server more than the multi-statement query it replaces. This
-- one is that query's four statements and nothing else, the guard riding on
-- the INSERT as it does there (onetrip.go): the event id is NULL unless the
-- DELETE took the row, and a NULL event_id fails the INSERT (error 1048)
-- in every sql_mode, so nothing of a refused completion commits and the
-- caller rolls it back. Measured with BenchmarkPredictedResults (one command
-- a step, docs/benchmarks.md): on MariaDB with its binary log on, less CPU
-- than the query on the client and on the server; elsewhere no more than
-- stepcollect_complete_predicted.
--
-- SQL SECURITY INVOKER, and used only while its enrollment and command
-- parameters have id_commands' character set and collation, as migration
-- 12's are (procedure.go).

-- +goose Up
-- +goose StatementBegin
CREATE PROCEDURE stepcollect_complete_single(
    IN p_enrollment VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_command    VARCHAR(127) CHARACTER SET utf8mb4,
    IN p_step       BIGINT,
    IN p_event_id   VARCHAR(64),
    IN p_event_type VARCHAR(32),
    IN p_payload    LONGBLOB)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
BEGIN
    START TRANSACTION;
    DELETE FROM id_commands
    WHERE enrollment_id = p_enrollment AND command_uuid = p_command
      AND step_id = p_step AND completed = 0;
    INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload)
    VALUES (IF(ROW_COUNT() = 1, p_event_id, NULL), p_event_type, p_step, p_enrollment, p_payload);
    COMMIT;
END
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE IF EXISTS stepcollect_complete_single;
