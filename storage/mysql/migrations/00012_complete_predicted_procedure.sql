-- A predicted completion, and a predicted store (onetrip.go), each as one
-- statement. Sent as a multi-statement query (START TRANSACTION; DELETE;
-- the guarded INSERT; COMMIT), every statement is parsed on arrival and
-- answered with a packet of its own, which the client wakes to read. A routine is parsed once per
-- connection, and a CALL is answered once, after its COMMIT: the client's
-- CPU a result a fifth to a half less, the server's up to a quarter, on
-- MySQL and on MariaDB without a binary log (on MariaDB with one the server
-- spends more, and the storage does not call them there;
-- BenchmarkPredictedResults, docs/benchmarks.md).
--
-- It does what the query does, in the same order, and nothing else: the
-- enrollment's predicted rows deleted by primary key, each only in its
-- predicted state (the reported command outstanding; every other stored
-- with the result whose SHA-256 the caller gives); the guard, which
-- refuses (SQLSTATE 45000, error 1644) unless every one was; then the
-- evidence (the event, the receipt, or both) and COMMIT. A refusal leaves
-- the transaction open with what the deletes took, and the caller rolls it
-- back, as after the query's guard.
--
-- stepcollect_store_predicted does the same for a result predicted to
-- leave another command outstanding (onetrip.go's store): one locking read
-- of the enrollment's rows of the step, by primary key in its order (as
-- the two-trip path's locking read), counting those predicted outstanding;
-- the guard unless it counted the reported row and every other; the
-- reported row's result written; COMMIT. Holding an outstanding row of the
-- step at COMMIT is what makes "not complete" true: whoever completes the
-- step must lock that row, and so sees this result.
--
-- p_others lists the other rows as "<hex of command_uuid>:<sha256 hex>",
-- comma-separated, and p_rows the store's rows as ",<hex>,<hex>,": hex,
-- so that no command UUID can hold a separator. A result or an event is a
-- LONGBLOB parameter: its bytes reach the column as an INSERT's would, not
-- through a character set of the routine's.
-- SQL SECURITY INVOKER: it runs with the caller's own privileges, and goes
-- on working if the account that migrated is dropped. The caller uses it
-- only while its parameters have id_commands' character set and collation
-- (a parameter that differs would be converted to, and keep the primary key
-- from serving the deletes), and falls back to the query otherwise. They
-- are utf8mb4, as migration 1's tables, whatever the database's default.

-- +goose Up
-- +goose StatementBegin
CREATE PROCEDURE stepcollect_complete_predicted(
    IN p_enrollment VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_command    VARCHAR(127) CHARACTER SET utf8mb4,
    IN p_step       BIGINT,
    IN p_others     MEDIUMTEXT,
    IN p_others_n   INT,
    IN p_event_id   VARCHAR(64),
    IN p_event_type VARCHAR(32),
    IN p_payload    LONGBLOB,
    IN p_receipt    BOOLEAN)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
BEGIN
    DECLARE took INT DEFAULT 0;
    DECLARE i INT DEFAULT 0;
    DECLARE rec MEDIUMTEXT;
    DECLARE other VARCHAR(127);

    START TRANSACTION;
    DELETE FROM id_commands
    WHERE enrollment_id = p_enrollment AND command_uuid = p_command
      AND step_id = p_step AND completed = 0;
    SET took = ROW_COUNT();
    WHILE i < p_others_n DO
        SET i = i + 1;
        SET rec = SUBSTRING_INDEX(SUBSTRING_INDEX(p_others, ',', i), ',', -1);
        SET other = UNHEX(SUBSTRING_INDEX(rec, ':', 1));
        DELETE FROM id_commands
        WHERE enrollment_id = p_enrollment AND command_uuid = other
          AND step_id = p_step AND completed = 1
          AND SHA2(result, 256) = CAST(SUBSTRING_INDEX(rec, ':', -1) AS BINARY);
        SET took = took + ROW_COUNT();
    END WHILE;
    IF took <> 1 + p_others_n THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'stepcollect: the enrollment''s rows of the step are not as predicted';
    END IF;
    IF p_event_id IS NOT NULL THEN
        INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload)
        VALUES (p_event_id, p_event_type, p_step, p_enrollment, p_payload);
    END IF;
    IF p_receipt THEN
        INSERT INTO stepcollect_receipts (step_id, enrollment_id) VALUES (p_step, p_enrollment);
    END IF;
    COMMIT;
END
-- +goose StatementEnd

-- +goose StatementBegin
CREATE PROCEDURE stepcollect_store_predicted(
    IN p_enrollment VARCHAR(255) CHARACTER SET utf8mb4,
    IN p_command    VARCHAR(127) CHARACTER SET utf8mb4,
    IN p_step       BIGINT,
    IN p_result     LONGBLOB,
    IN p_rows       MEDIUMTEXT,
    IN p_rows_n     INT)
    MODIFIES SQL DATA
    SQL SECURITY INVOKER
BEGIN
    DECLARE took INT DEFAULT 0;

    START TRANSACTION;
    SELECT COUNT(*) INTO took FROM id_commands FORCE INDEX (PRIMARY)
    WHERE enrollment_id = p_enrollment AND step_id = p_step AND completed = 0
      AND LOCATE(CONCAT(',', HEX(command_uuid), ','), p_rows) > 0
    FOR UPDATE;
    IF took <> p_rows_n OR LOCATE(CONCAT(',', HEX(p_command), ','), p_rows) = 0 THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = 'stepcollect: the enrollment''s rows of the step are not as predicted';
    END IF;
    UPDATE id_commands SET result = p_result, completed = 1
    WHERE enrollment_id = p_enrollment AND command_uuid = p_command AND step_id = p_step AND completed = 0;
    COMMIT;
END
-- +goose StatementEnd

-- +goose Down
DROP PROCEDURE IF EXISTS stepcollect_store_predicted;
DROP PROCEDURE IF EXISTS stepcollect_complete_predicted;
