-- NanoCMD v0.7.1 engine/storage/mysql/schema.sql, unchanged but for IF NOT
-- EXISTS, so that a database NanoCMD already made is adopted as it is, and
-- utf8mb4 whatever the database's default character set (an older database
-- may be utf8mb3 or latin1, which cannot hold every id a client sends).

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS steps (
    id   BIGINT  NOT NULL AUTO_INCREMENT PRIMARY KEY,

    workflow_name VARCHAR(255) NOT NULL,
    instance_id   VARCHAR(255) NOT NULL,
    step_name     VARCHAR(255) NULL,

    context MEDIUMTEXT NULL,

    not_until      TIMESTAMP NULL,
    timeout        TIMESTAMP NULL,

    process_id     CHAR(45) NULL,

    INDEX (workflow_name),
    INDEX (not_until),
    INDEX (timeout),
    INDEX (process_id),

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP
) DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS id_commands (
    enrollment_id VARCHAR(255) NOT NULL,
    command_uuid  VARCHAR(127) NOT NULL,

    step_id BIGINT NOT NULL,

    request_type VARCHAR(63)  NOT NULL,
    completed    BOOLEAN      NOT NULL DEFAULT 0,
    result       MEDIUMTEXT   NULL,

    last_push TIMESTAMP NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    INDEX (enrollment_id),
    INDEX (command_uuid),
    INDEX (step_id),
    INDEX (completed),
    INDEX (last_push),

    FOREIGN KEY (step_id)
        REFERENCES steps (id),

    PRIMARY KEY (enrollment_id, command_uuid)
) DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS step_commands (
    command_uuid VARCHAR(127) NOT NULL,
    step_id      BIGINT       NOT NULL,

    command      MEDIUMTEXT   NOT NULL,
    request_type VARCHAR(63)  NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    FOREIGN KEY (step_id)
        REFERENCES steps (id),

    PRIMARY KEY (command_uuid, step_id)
) DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS wf_events (
    event_name VARCHAR(255) NOT NULL,

    context       MEDIUMTEXT   NULL,
    event_context MEDIUMTEXT   NULL,
    workflow_name VARCHAR(255) NOT NULL,
    event_type    VARCHAR(63)  NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    INDEX (event_type),

    PRIMARY KEY (event_name)
) DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS wf_status (
    enrollment_id VARCHAR(255) NOT NULL,
    workflow_name VARCHAR(255) NOT NULL,

    -- this was intended to be "DEFAULT (UNIX_TIMESTAMP() * 1000)"
    -- which would complement the Golang `time.Time{}.UnixMilli()`.
    -- however sqlc seems to not support that syntax, so we'll settle
    -- for less precision.
    last_created_unix BIGINT NOT NULL DEFAULT (UNIX_TIMESTAMP()),

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    INDEX (enrollment_id),
    INDEX (workflow_name),

    PRIMARY KEY (enrollment_id, workflow_name)
) DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE IF EXISTS wf_status;
DROP TABLE IF EXISTS wf_events;
DROP TABLE IF EXISTS step_commands;
DROP TABLE IF EXISTS id_commands;
DROP TABLE IF EXISTS steps;
