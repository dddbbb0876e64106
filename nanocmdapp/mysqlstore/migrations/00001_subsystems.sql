-- NanoCMD's subsystems in MySQL. subsystem_profiles is NanoCMD v0.7.1's own
-- table (subsystem/profile/storage/mysql/schema.sql) with IF NOT EXISTS, so
-- a database NanoCMD made keeps its profiles; the others are new.

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
);

-- One JSON object of inventory values per enrollment, merged under a row
-- lock.
CREATE TABLE IF NOT EXISTS subsystem_inventory (
    enrollment_id VARCHAR(255) NOT NULL,
    inventory     MEDIUMTEXT   NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    PRIMARY KEY (enrollment_id)
);

CREATE TABLE IF NOT EXISTS subsystem_cmdplans (
    name    VARCHAR(255) NOT NULL,
    cmdplan MEDIUMTEXT   NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,
    updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,

    PRIMARY KEY (name)
);

-- The FileVault PRK escrow keypair: one row, inserted only if absent, never
-- updated, so every replica and every restart decrypts with the same key.
CREATE TABLE IF NOT EXISTS subsystem_filevault_keypair (
    name        VARCHAR(64) NOT NULL,
    private_key BLOB        NOT NULL,
    certificate BLOB        NOT NULL,

    created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP,

    PRIMARY KEY (name)
);

-- +goose Down
DROP TABLE IF EXISTS subsystem_filevault_keypair;
DROP TABLE IF EXISTS subsystem_cmdplans;
DROP TABLE IF EXISTS subsystem_inventory;
-- subsystem_profiles is NanoCMD's and may predate this migration: kept.
