package mysqlstore

// Every SQL statement of the subsystem storages. Portable to MySQL 8.0.19+
// (tested on 9.7) and MariaDB 10.6+ (tested on 10.11): no `INSERT … AS new`
// (MariaDB refuses it); an upsert names the new row with VALUES(col), which
// both accept. A list parameter is written "IN (?)" and expanded by expand.

const (
	qAllProfileInfos = `SELECT name, profile_id, profile_uuid FROM subsystem_profiles`
	qProfileInfos    = `SELECT name, profile_id, profile_uuid FROM subsystem_profiles WHERE name IN (?)`
	qRawProfiles     = `SELECT name, raw_profile FROM subsystem_profiles WHERE name IN (?)`
	qStoreProfile    = `
INSERT INTO subsystem_profiles (name, profile_id, profile_uuid, raw_profile)
VALUES (?, ?, ?, ?)
ON DUPLICATE KEY UPDATE
  profile_id = VALUES(profile_id),
  profile_uuid = VALUES(profile_uuid),
  raw_profile = VALUES(raw_profile)`
	qDeleteProfile = `DELETE FROM subsystem_profiles WHERE name = ?`

	qInventories = `SELECT enrollment_id, inventory FROM subsystem_inventory WHERE enrollment_id IN (?)`
	// The merge of flat values, many enrollments' in one statement (see
	// mergegroup.go): the upsert holds each enrollment's row lock from its
	// read to its write, so a second replica's merge waits for it and merges
	// into its result. Its top-level keys replace the stored ones
	// (JSON_MERGE_PATCH, on MySQL and MariaDB); values that are objects or
	// null, which a patch would merge into or delete, take the locked
	// read-merge-write below instead. VALUES() as in qStoreProfile: MariaDB
	// has no row alias.
	qMergeInventories     = `INSERT INTO subsystem_inventory (enrollment_id, inventory) VALUES `
	qMergeInventoriesTail = `
ON DUPLICATE KEY UPDATE inventory = JSON_MERGE_PATCH(inventory, VALUES(inventory))`
	// The merge's read: the enrollment's row locked until the merge commits,
	// so a second replica's merge waits and then reads this one's result.
	qLockInventory   = `SELECT inventory FROM subsystem_inventory WHERE enrollment_id = ? FOR UPDATE`
	qInsertInventory = `INSERT INTO subsystem_inventory (enrollment_id, inventory) VALUES (?, ?)`
	qUpdateInventory = `UPDATE subsystem_inventory SET inventory = ? WHERE enrollment_id = ?`
	qDeleteInventory = `DELETE FROM subsystem_inventory WHERE enrollment_id = ?`

	qCMDPlan      = `SELECT cmdplan FROM subsystem_cmdplans WHERE name = ?`
	qStoreCMDPlan = `
INSERT INTO subsystem_cmdplans (name, cmdplan) VALUES (?, ?)
ON DUPLICATE KEY UPDATE cmdplan = VALUES(cmdplan)`
	qDeleteCMDPlan = `DELETE FROM subsystem_cmdplans WHERE name = ?`

	// Insert-only: the first process to get here wins, every other one
	// (another replica starting at the same moment, a restart) reads the
	// winner's pair back.
	qInsertKeypair = `
INSERT IGNORE INTO subsystem_filevault_keypair (name, private_key, certificate)
VALUES (?, ?, ?)`
	qKeypair = `SELECT private_key, certificate FROM subsystem_filevault_keypair WHERE name = ?`

	// A table's collation, for migration 2 (charset.go). Non-locking.
	qTableCollation = `SELECT TABLE_COLLATION FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?`
)
