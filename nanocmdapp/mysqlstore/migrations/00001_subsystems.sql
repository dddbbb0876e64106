-- NanoCMD's subsystems in MySQL. subsystem_profiles is NanoCMD v0.7.1's own
-- table (subsystem/profile/storage/mysql/schema.sql) with IF NOT EXISTS, so
-- a database NanoCMD made keeps its profiles; the others are new. Each in
-- utf8mb4 whatever the database's default (a device name may hold an
-- emoji); migration 2 converts the tables an older database has.

-- +goose NO TRANSACTION
-- +goose Up
CREATE TABLE IF NOT EXISTS subsystem_profiles (
    name VARCHAR(255) NOT NULL,

    profile_id   VARCHAR(255) NOT NULL,
    profile_uuid VARCHAR(255) NOT NULL,
    raw_profile  MEDIUMTEXT NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    PRIMARY KEY (name)
) DEFAULT CHARSET=utf8mb4;

-- One JSON object of inventory values per enrollment, merged under a row
-- lock.
CREATE TABLE IF NOT EXISTS subsystem_inventory (
    enrollment_id VARCHAR(255) NOT NULL,
    inventory     MEDIUMTEXT   NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    PRIMARY KEY (enrollment_id)
) DEFAULT CHARSET=utf8mb4;

CREATE TABLE IF NOT EXISTS subsystem_cmdplans (
    name    VARCHAR(255) NOT NULL,
    cmdplan MEDIUMTEXT   NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    PRIMARY KEY (name)
) DEFAULT CHARSET=utf8mb4;

-- The FileVault PRK escrow keypair: one row, inserted only if absent, never
-- updated, so every replica and every restart decrypts with the same key.
CREATE TABLE IF NOT EXISTS subsystem_filevault_keypair (
    name        VARCHAR(64) NOT NULL,
    private_key BLOB        NOT NULL,
    certificate BLOB        NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,

    PRIMARY KEY (name)
) DEFAULT CHARSET=utf8mb4;

-- +goose Down
DROP TABLE IF EXISTS subsystem_filevault_keypair;
DROP TABLE IF EXISTS subsystem_cmdplans;
DROP TABLE IF EXISTS subsystem_inventory;
-- subsystem_profiles is NanoCMD's and may predate this migration: kept.
