package mysql

// Every SQL statement of this backend, in one place. Rules they follow (see
// the package doc for why):
//
//   - No DELETE or UPDATE joins another table: single-table statements by key.
//   - A locking read on id_commands goes through the PRIMARY key
//     (enrollment_id, command_uuid), so it locks only the reporting
//     enrollment's rows and every transaction locks them in the same order.
//     Left to itself the optimizer may drive from the step_id index, which
//     every enrollment of a fan-out shares.
//   - Portable to MySQL 8.0.19+ and MariaDB 10.6+: no `INSERT … AS new`, no
//     `FOR UPDATE OF`, no VALUES ROW(), no RETURNING.
//
// A list parameter is written "IN (?)" (or "IN ((?, ?))" for pairs) and
// expanded by expand; callers chunk their lists to maxInList.

const (
	// Readiness on a Galera node (ready.go): SHOW, which a node without
	// quorum still answers, and the same on MySQL and MariaDB.
	qWsrepOn    = `SHOW GLOBAL VARIABLES LIKE 'wsrep_on'`
	qWsrepState = `SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_ready', 'wsrep_cluster_status', 'wsrep_local_state_comment', 'wsrep_cluster_size')`
	// The schema's version (ready.go): the last migration goose recorded.
	qSchemaVersion = `SELECT MAX(version_id) FROM ` + MigrationsTable

	// Which step does this enrollment's command belong to. Non-locking; the
	// engine's "was this sent by a workflow" question.
	qGetRequestType = `
SELECT request_type FROM id_commands
WHERE enrollment_id = ? AND command_uuid = ?`
	// One asker's branch of the batched lookup (lookup.go): its index,
	// then qGetRequestType's answer.
	qGetRequestTypeBranch = `(SELECT ?, request_type FROM id_commands WHERE enrollment_id = ? AND command_uuid = ?)`

	// The completion transaction's decision: every row this enrollment
	// holds for the step that command_uuid belongs to, locked. It is all
	// the completion decision needs, and nothing another enrollment owns is
	// touched. An unknown command yields no rows. The results stay on the
	// server (their lengths size the event): the 39th result of a
	// 40-command step would otherwise read the 38 before it.
	//
	// A stored result of at most inlineResultMax bytes comes with its row:
	// the completion needs the others' results, and a step's commands are
	// mostly small answers (DeviceInformation, SecurityInfo), so one read
	// serves where two were. Larger ones are read once the completion is
	// decided (qReadEnrollmentStepResults).
	qLockEnrollmentStepRows = `
SELECT command_uuid, step_id, request_type, completed, COALESCE(LENGTH(result), 0),
  IF(completed AND LENGTH(result) <= 65536, result, NULL)
FROM id_commands FORCE INDEX (PRIMARY)
WHERE enrollment_id = ? AND step_id = (
  SELECT step_id FROM id_commands
  WHERE enrollment_id = ? AND command_uuid = ?)
FOR UPDATE`

	// The completion, once decided: the results of this enrollment's
	// step, read once (the reporting command's own, which it replaces,
	// left on the server). The rows are ours already; FOR UPDATE makes it
	// a current read whatever the isolation level (a REPEATABLE READ
	// snapshot may predate the lock wait). Same range as the locking read:
	// a "command_uuid <> ?" would end its scan on the next enrollment's
	// first row, and wait for whoever holds it.
	qReadEnrollmentStepResults = `
SELECT command_uuid, request_type, IF(command_uuid = ?, NULL, result)
FROM id_commands FORCE INDEX (PRIMARY)
WHERE enrollment_id = ? AND step_id = ?
ORDER BY command_uuid
FOR UPDATE`

	// The size of a step's event before it is built: its names and the
	// length of its context, and the context itself when the step cache
	// keeps it (64 KiB), so that the rest of a fan-out finds it cached.
	// Non-locking, like qGetStep.
	qGetStepSizes = `
SELECT workflow_name, instance_id, step_name, COALESCE(LENGTH(context), 0),
  IF(LENGTH(context) <= 65536, context, NULL)
FROM steps WHERE id = ?`

	// A completion predicted (onetrip.go): the enrollment's rows of the
	// step, each by its primary key and only in its predicted state, the
	// reported command outstanding (qDeletePredictedOutstanding), every
	// other one stored with the result its event carries
	// (qDeletePredictedStored, by SHA-256), joined with OR. By key: it
	// locks those rows and no other, as the locking read does.
	qDeletePredicted            = `DELETE FROM id_commands WHERE `
	qDeletePredictedOutstanding = `(enrollment_id = ? AND command_uuid = ? AND step_id = ? AND completed = 0)`
	qDeletePredictedStored      = `(enrollment_id = ? AND command_uuid = ? AND step_id = ? AND completed = 1 AND SHA2(result, 256) = ?)`
	// Its guard, right after it: fails unless it deleted all ? of them,
	// and the server runs nothing of the query after a failed statement.
	// No table is read: ROW_COUNT() is the delete's. The failure is a
	// session variable set to a value it cannot take (error 1231), and
	// success sets it to what it is: the cheapest statement both servers
	// refuse on a condition (a third of what a subquery of two rows,
	// the guard before it, cost the server).
	qGuardDeleted = `SET SESSION sql_notes = IF(ROW_COUNT() = ?, @@session.sql_notes, 2)`
	// Where the completion writes one evidence row (its event, or its
	// receipt), that INSERT carries the same guard instead, a statement
	// fewer (each statement of the query is an answer the server sends and
	// the client reads): its first value is NULL unless the delete took all
	// ? rows, and a single-row INSERT of NULL into a NOT NULL column fails
	// (error 1048) in every sql_mode, on both servers. ROW_COUNT() in the
	// INSERT's values is still the delete's.
	qInsertOutboxGuarded = `
INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload)
VALUES (IF(ROW_COUNT() = ?, ?, NULL), ?, ?, ?, ?)`
	qInsertReceiptGuarded = `INSERT INTO stepcollect_receipts (step_id, enrollment_id) VALUES (IF(ROW_COUNT() = ?, ?, NULL), ?)`

	// The same completion as one CALL (procedure.go; the routine is
	// migration 12's): the enrollment, the reported command, the step, the
	// other rows with their results' SHA-256 and how many, then the event
	// (its id NULL for none), and whether to write the receipt.
	qCallCompletePredicted = `CALL stepcollect_complete_predicted(?, ?, ?, ?, ?, ?, ?, ?, ?)`
	// A predicted store as one CALL (procedure.go): the enrollment, the
	// reported command, the step, its result, then the rows predicted
	// outstanding (the reported one among them) and how many.
	qCallStorePredicted = `CALL stepcollect_store_predicted(?, ?, ?, ?, ?, ?)`
	// A completion of the enrollment's only row of the step, with its
	// event, as one CALL of migration 13's routine: the enrollment, the
	// reported command, the step, then the event.
	qCallCompleteSingle = `CALL stepcollect_complete_single(?, ?, ?, ?, ?, ?)`
	// The server's binary log and version: whether the routines pay
	// (procedure.go).
	qServerLogBin = `SELECT @@log_bin, VERSION()`
	// Whether a routine is there at all (migrate.go). Non-locking.
	qRoutineExists = `
SELECT COUNT(*) FROM information_schema.ROUTINES
WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ? AND ROUTINE_TYPE = 'PROCEDURE'`
	// Whether the routines are there and their enrollment and command
	// parameters have the character set and collation of id_commands'
	// columns: 4 when both of migration 12's do, and 2 when migration 13's
	// does. Non-locking.
	qCompleteProcFits = `
SELECT COALESCE(SUM(p.SPECIFIC_NAME <> 'stepcollect_complete_single'), 0),
  COALESCE(SUM(p.SPECIFIC_NAME = 'stepcollect_complete_single'), 0)
FROM information_schema.PARAMETERS p
JOIN information_schema.COLUMNS c
  ON c.TABLE_SCHEMA = p.SPECIFIC_SCHEMA AND c.TABLE_NAME = 'id_commands'
  AND c.COLUMN_NAME = IF(p.PARAMETER_NAME = 'p_enrollment', 'enrollment_id', 'command_uuid')
WHERE p.SPECIFIC_SCHEMA = DATABASE() AND p.ROUTINE_TYPE = 'PROCEDURE'
  AND p.SPECIFIC_NAME IN ('stepcollect_complete_predicted', 'stepcollect_store_predicted', 'stepcollect_complete_single')
  AND p.PARAMETER_NAME IN ('p_enrollment', 'p_command')
  AND p.CHARACTER_SET_NAME = c.CHARACTER_SET_NAME AND p.COLLATION_NAME = c.COLLATION_NAME`

	// A result predicted to leave another command outstanding (onetrip.go):
	// one UPDATE takes, by primary key and only while outstanding, the
	// reported row (writing its result) and the others predicted outstanding,
	// locking them as the locking read does. Each row counts itself into
	// LAST_INSERT_ID() (the reported one as 1000, each other as 1; times 0, so
	// no column changes), and the guard fails unless the tally is 1000 plus
	// the others predicted (docs/design.md, "How a result is committed").
	qResetTally     = `DO LAST_INSERT_ID(0)`
	qRecordResultIf = `UPDATE id_commands SET
  result = IF(command_uuid = ?, ?, result),
  completed = IF(command_uuid = ?, 1 + 0 * LAST_INSERT_ID(LAST_INSERT_ID() + 1000), completed + 0 * LAST_INSERT_ID(LAST_INSERT_ID() + 1))
WHERE enrollment_id = ? AND step_id = ? AND completed = 0 AND command_uuid IN (`
	qGuardTally = `SET SESSION sql_notes = IF(LAST_INSERT_ID() = ?, @@session.sql_notes, 2)`

	qRecordResult = `
UPDATE id_commands SET completed = ?, result = ?
WHERE enrollment_id = ? AND command_uuid = ?`

	qTouchNotNow = `
UPDATE id_commands SET updated_at = CURRENT_TIMESTAMP
WHERE enrollment_id = ? AND command_uuid = ?`

	qDeleteEnrollmentStepRows = `
DELETE FROM id_commands WHERE enrollment_id = ? AND step_id = ?`

	// Step rows never change after StoreStep (but for not_until), so this
	// non-locking read may be cached by id.
	qGetStep = `
SELECT workflow_name, instance_id, step_name, context FROM steps WHERE id = ?`

	// stepcollect_ids keeps how many enrollments the step was sent to
	// (GET /v1/steps), which id_commands forgets as they finish.
	qCreateStep = `
INSERT INTO steps (workflow_name, instance_id, step_name, context, not_until, timeout, stepcollect_ids)
VALUES (?, ?, ?, ?, ?, ?, ?)`

	qCreateStepCommands = `
INSERT INTO step_commands (step_id, command_uuid, request_type, command) VALUES `
	qCreateStepCommandsRow = `(?, ?, ?, ?)`

	// The only INSERT INTO id_commands, and it only ever runs in the
	// transaction that created the steps row it points at: an existing step
	// can never gain a reference, which is what makes "unreferenced"
	// terminal and lets collection check without a lock.
	qCreateIDCommands = `
INSERT INTO id_commands (enrollment_id, command_uuid, step_id, request_type, last_push) VALUES `
	qCreateIDCommandsRow = `(?, ?, ?, ?, ?)`

	// After a duplicate-key error on StoreStep: which enrollment already
	// holds which of the UUIDs, to name it in the error.
	qFindConflict = `
SELECT enrollment_id, command_uuid FROM id_commands
WHERE command_uuid IN (?) AND enrollment_id IN (?)
ORDER BY enrollment_id, command_uuid LIMIT 1`

	// CancelSteps: lock all of this enrollment's rows (its own, in PRIMARY
	// order, as completion does) and note which steps they belong to.
	qLockEnrollmentRows = `
SELECT DISTINCT step_id FROM id_commands FORCE INDEX (PRIMARY)
WHERE enrollment_id = ? FOR UPDATE`

	// Non-locking: which of these steps belong to workflow_name.
	qFilterStepsByWorkflow = `
SELECT id FROM steps WHERE id IN (?) AND workflow_name = ?`

	qDeleteEnrollmentStepsRows = `
DELETE FROM id_commands WHERE enrollment_id = ? AND step_id IN (?)`

	qOutstandingIDs = `
SELECT DISTINCT c.enrollment_id
FROM id_commands c JOIN steps s ON s.id = c.step_id
WHERE c.enrollment_id IN (?) AND c.completed = 0 AND s.workflow_name = ?`

	// Collection, phase one: outside any transaction (see collect.go). Which
	// of these steps still exist, and whether anything refers to them.
	qCheckSteps = `
SELECT s.id, EXISTS (SELECT 1 FROM id_commands c WHERE c.step_id = s.id)
FROM steps s WHERE s.id IN (?)`

	// Collection, phase two: claim. Rows someone else holds are skipped, so
	// no collector ever waits on another or on the timeout sweep.
	qClaimSteps = `
SELECT id FROM steps WHERE id IN (?) ORDER BY id FOR UPDATE SKIP LOCKED`

	// Sweeper: the next batch of steps after a cursor, each with whether
	// anything refers to it. Bounded per statement (LIMIT on the PRIMARY
	// key, one step_id index probe per row), however many steps exist or
	// however few are unreferenced.
	qScanSteps = `
SELECT s.id, EXISTS (SELECT 1 FROM id_commands c WHERE c.step_id = s.id)
FROM steps s WHERE s.id > ? ORDER BY s.id LIMIT ?`

	// Sweeper: raw commands whose step is gone. The foreign key prevents
	// these; a schema without it (NanoCMD's allows dropping it) does not.
	qScanStepCommandOwners = `
SELECT sc.step_id, EXISTS (SELECT 1 FROM steps s WHERE s.id = sc.step_id)
FROM step_commands sc WHERE sc.step_id > ?
GROUP BY sc.step_id ORDER BY sc.step_id LIMIT ?`

	// Raw commands go with their step, and first: they hold a foreign key
	// to it.
	qDeleteStepCommands = `DELETE FROM step_commands WHERE step_id IN (?)`
	qDeleteSteps        = `DELETE FROM steps WHERE id IN (?)`

	// Worker: steps whose NotUntil passed, claimed so that any number of
	// workers can run this at once.
	qClaimDueSteps = `
SELECT id, workflow_name, instance_id, step_name, context
FROM steps WHERE not_until < ?
ORDER BY not_until, id LIMIT ? FOR UPDATE SKIP LOCKED`

	qGetStepCommands = `
SELECT step_id, command_uuid, request_type, command
FROM step_commands WHERE step_id IN (?) ORDER BY step_id, command_uuid`

	qGetStepEnrollments = `
SELECT DISTINCT step_id, enrollment_id FROM id_commands
WHERE step_id IN (?) ORDER BY step_id, enrollment_id`

	qMarkStepsPushed = `
UPDATE id_commands SET last_push = ? WHERE step_id IN (?)`

	// A sent NotUntil step is an ordinary step from now on: clearing
	// not_until keeps it from being sent again, and leaves timeout (and the
	// timeout sweep) alone. NanoCMD's process_id marker blocked the timeout
	// of such a step forever.
	qClearNotUntil = `
UPDATE steps SET not_until = NULL WHERE id IN (?)`

	// Worker: steps whose timeout passed, claimed as above.
	qClaimTimedOutSteps = `
SELECT id, workflow_name, instance_id, step_name, context
FROM steps WHERE timeout <= ?
ORDER BY timeout, id LIMIT ? FOR UPDATE SKIP LOCKED`

	// Non-locking: whose rows those steps still have. The locking read that
	// follows goes through PRIMARY, in the order completion locks.
	qGetStepEnrollmentIDs = `
SELECT DISTINCT enrollment_id FROM id_commands WHERE step_id = ? ORDER BY enrollment_id LIMIT ?`

	qLockTimedOutRows = `
SELECT enrollment_id, command_uuid, request_type, completed, result
FROM id_commands FORCE INDEX (PRIMARY)
WHERE enrollment_id IN (?) AND step_id = ?
ORDER BY enrollment_id, command_uuid
FOR UPDATE`

	qDeleteTimedOutRows = `
DELETE FROM id_commands WHERE enrollment_id IN (?) AND step_id = ?`

	// Setting aside a due or timed-out step whose event cannot be written:
	// its time is cleared (so the claims above pass over it, as they pass
	// over a sent step) and kept, with the reason, in stepcollect_set_aside.
	qLockStepTimes = `
SELECT not_until, timeout FROM steps WHERE id = ? FOR UPDATE`
	qClearTimeout = `
UPDATE steps SET timeout = NULL WHERE id = ?`
	// Upsert through a derived table (see qRecordWorkflowStarted).
	qRecordSetAside = `
INSERT INTO stepcollect_set_aside (step_id, event_type, was_at, reason)
SELECT * FROM (SELECT ? AS s, ? AS t, ? AS w, ? AS r) AS x
ON DUPLICATE KEY UPDATE was_at = x.w, reason = x.r, created_at = CURRENT_TIMESTAMP(6)`

	// Worker: APNs re-push. Claimed with SKIP LOCKED so two workers never
	// push the same enrollment twice for one interval.
	qClaimRePush = `
SELECT enrollment_id, command_uuid FROM id_commands
WHERE last_push IS NOT NULL AND last_push < ?
ORDER BY last_push LIMIT ? FOR UPDATE SKIP LOCKED`

	qMarkRePushed = `
UPDATE id_commands SET last_push = ? WHERE (enrollment_id, command_uuid) IN ((?, ?))`

	// The completion's event, written with the deletes it reports.
	qInsertOutbox = `
INSERT INTO stepcollect_outbox (event_id, event_type, step_id, enrollment_id, payload)
VALUES (?, ?, ?, ?, ?)`

	// After a COMMIT whose answer was lost: did it write this event? The
	// event id is derived from the state change, so only that COMMIT can
	// have written it.
	qEventExists = `SELECT 1 FROM stepcollect_outbox WHERE event_id = ?`

	// A completion's receipt without the outbox (WithReceipts), the same
	// evidence by step and enrollment; pruned by age, a bounded batch at a
	// time.
	qInsertReceipt = `INSERT INTO stepcollect_receipts (step_id, enrollment_id) VALUES (?, ?)`
	qReceiptExists = `SELECT 1 FROM stepcollect_receipts WHERE step_id = ? AND enrollment_id = ?`
	qPruneReceipts = `DELETE FROM stepcollect_receipts WHERE created_at < NOW(6) - INTERVAL ? MICROSECOND ORDER BY created_at LIMIT 1000`

	// After a COMMIT whose answer was lost: is the step that try inserted
	// there? Nobody can have completed and collected it yet: the engine
	// sends its commands only once StoreStep returns.
	qStepOwnedBy = `
SELECT workflow_name, instance_id FROM steps WHERE id = ?`

	// Delivery, batched: the events nobody is delivering (never claimed:
	// written with a lease long lapsed, the column's default, or NULL
	// before migration 00011; or whose lease lapsed: a failed try's
	// backoff ended, or the worker that held it died), locked so that any
	// number of workers can claim at once and none waits on another. The outbox in MySQL, not the
	// queue, decides who delivers. Read through outbox_held_at: its
	// held_at IS NULL entries are in id order, so held events are never
	// scanned and no sort is needed. The age is the event's since it was
	// written or released, by the server's clock (-max-delivery-age).
	qClaimDueEvents = `
SELECT id, event_id, event_type, payload, attempts,
  TIMESTAMPDIFF(MICROSECOND, COALESCE(released_at, created_at), CURRENT_TIMESTAMP(6))
FROM stepcollect_outbox FORCE INDEX (outbox_held_at)
WHERE held_at IS NULL AND id > ? AND (lease_until IS NULL OR lease_until <= ?)
ORDER BY id LIMIT ? FOR UPDATE SKIP LOCKED`

	// A probe's claims (ClaimProbeEvent): the newest event nobody is
	// delivering, read backwards through the same index; and the range of
	// row ids, for a random place to start from.
	qClaimNewestDueEvent = `
SELECT id, event_id, event_type, payload, attempts,
  TIMESTAMPDIFF(MICROSECOND, COALESCE(released_at, created_at), CURRENT_TIMESTAMP(6))
FROM stepcollect_outbox FORCE INDEX (outbox_held_at)
WHERE held_at IS NULL AND (lease_until IS NULL OR lease_until <= ?)
ORDER BY id DESC LIMIT 1 FOR UPDATE SKIP LOCKED`
	qOutboxIDRange = `SELECT MIN(id), MAX(id) FROM stepcollect_outbox`

	// The lease replaces a value of its own size (never NULL, see
	// migration 00011): the row is updated in place.
	qLeaseEvents = `
UPDATE stepcollect_outbox SET attempts = attempts + 1, lease_until = ?, retry_at = NULL WHERE id IN (?)`

	// A delivery still running keeps its lease.
	// A worker's renewals, acknowledgements, failures and holds name each
	// event by its row and its event id: after a failover to a replica
	// that lost the last writes, the row ids the worker claimed may have
	// been given to other events, and an acknowledgement by id alone would
	// delete an event nobody delivered (e2e/failover's asynchronous
	// replica test saw it). event_id is unique, so the pair is the event.
	qRenewLeases = `
UPDATE stepcollect_outbox SET lease_until = ? WHERE id IN (?) AND event_id IN (?)`

	qAckEvents = `DELETE FROM stepcollect_outbox WHERE id IN (?) AND event_id IN (?)`

	// retry_at marks the lease as a backoff, not a delivery in flight.
	qFailEvent = `
UPDATE stepcollect_outbox SET last_error = ?, lease_until = ?, retry_at = ? WHERE id = ? AND event_id = ?`

	// What every replica exports at scrape time: the outbox (its count,
	// and the age by the server's clock of its oldest event not held,
	// since written or released: the first held_at IS NULL entry of
	// outbox_held_at), the last sweep's findings, the held events and
	// whether delivery is paused, and the steps set aside. Held events have
	// an alert of their own.
	qGauges = `
SELECT (SELECT COUNT(*) FROM stepcollect_outbox),
  (SELECT TIMESTAMPDIFF(MICROSECOND, COALESCE(released_at, created_at), CURRENT_TIMESTAMP(6))
   FROM stepcollect_outbox FORCE INDEX (outbox_held_at) WHERE held_at IS NULL ORDER BY id LIMIT 1),
  (SELECT value FROM stepcollect_state WHERE name = 'uncollected_steps'),
  (SELECT TIMESTAMPDIFF(MICROSECOND, updated_at, CURRENT_TIMESTAMP(6)) FROM stepcollect_state WHERE name = 'uncollected_steps'),
  (SELECT COUNT(*) FROM stepcollect_outbox WHERE held_at IS NOT NULL),
  (SELECT paused FROM stepcollect_delivery WHERE id = 1),
  (SELECT COUNT(*) FROM stepcollect_set_aside)`

	// Upsert through a derived table (see qRecordWorkflowStarted).
	qRecordState = `
INSERT INTO stepcollect_state (name, value)
SELECT * FROM (SELECT ? AS n, ? AS v) AS x
ON DUPLICATE KEY UPDATE value = x.v, updated_at = CURRENT_TIMESTAMP(6)`

	qStateExists = `SELECT COUNT(*) FROM stepcollect_state WHERE name = ?`

	// The deployment's queue namespace (QueueNamespace, migration 15).
	qGetQueueNamespace    = `SELECT queue_namespace FROM stepcollect_deployment WHERE id = 1`
	qEnsureQueueNamespace = `INSERT IGNORE INTO stepcollect_deployment (id, queue_namespace) VALUES (1, LEFT(SHA2(UUID(), 256), 16))`

	// The deployment's event id salt (EventIDSalt, migration 16). Set only
	// where there is none, so the first writer's value wins.
	qGetEventIDSalt    = `SELECT event_id_salt FROM stepcollect_deployment WHERE id = 1`
	qEnsureEventIDSalt = `UPDATE stepcollect_deployment SET event_id_salt = ? WHERE id = 1 AND event_id_salt IS NULL`

	// Which server answers (ServerIdentity): host, port and server_id
	// tell a promoted replica, or another Galera node, from the server
	// before it on both kinds (MariaDB has no server_uuid).
	qServerIdentity = `SELECT CONCAT(@@hostname, ':', @@port, ' server_id ', @@server_id)`

	qStepStatus = `
SELECT s.workflow_name, s.instance_id, s.step_name, s.created_at,
  (SELECT COUNT(DISTINCT c.enrollment_id) FROM id_commands c WHERE c.step_id = s.id)
FROM steps s WHERE s.id = ?`

	// Operators' step queries (operator.go). The list runs oldest first
	// on (created_at, id): each filter has an index whose prefix it fixes
	// (00006), and the cursor continues it as a range. The outstanding
	// count of each listed step reads its step_id index entries only.
	qListSteps = `
SELECT s.id, s.workflow_name, s.instance_id, s.step_name, s.created_at, s.not_until, s.timeout, s.stepcollect_ids,
  (SELECT COUNT(DISTINCT c.enrollment_id) FROM id_commands c WHERE c.step_id = s.id)
FROM steps s WHERE 1 = 1`
	qListStepsAfter = ` AND (s.created_at > ? OR (s.created_at = ? AND s.id > ?))`
	// After a step without a creation time: ORDER BY puts NULL first, so
	// the rest of those by id, then every step that has one.
	qListStepsAfterNoTime = ` AND (s.created_at IS NOT NULL OR s.id > ?)`
	qListStepsWorkflow    = ` AND s.workflow_name = ?`
	qListStepsInstance    = ` AND s.instance_id = ?`
	qListStepsOlderThan   = ` AND s.created_at <= TIMESTAMPADD(MICROSECOND, -?, CURRENT_TIMESTAMP)`
	qListStepsOrderLimit  = ` ORDER BY s.created_at, s.id LIMIT ?`
	qStepExists           = `SELECT 1 FROM steps WHERE id = ?`
	qStepOutstandingAfter = `
SELECT DISTINCT enrollment_id FROM id_commands
WHERE step_id = ? AND enrollment_id > ? ORDER BY enrollment_id LIMIT ?`

	// Cancelling a step: the enrollments' rows locked through PRIMARY, in
	// the order completion locks them, then deleted by the PRIMARY prefix
	// (at most 100 enrollments, under eq_range_index_dive_limit's 200: a
	// (enrollment_id, command_uuid) IN list of 200 pairs is estimated from
	// statistics and scanned, 100 times slower).
	qLockStepRows = `
SELECT enrollment_id, command_uuid FROM id_commands FORCE INDEX (PRIMARY)
WHERE enrollment_id IN (?) AND step_id = ?
ORDER BY enrollment_id, command_uuid
FOR UPDATE`
	qDeleteStepRows = `
DELETE FROM id_commands WHERE enrollment_id IN (?) AND step_id = ?`

	// A workflow instance's steps, by the instance index.
	qInstanceSteps = `
SELECT id FROM steps WHERE instance_id = ? AND workflow_name = ? AND id > ? ORDER BY id LIMIT ?`

	qGetWorkflowStarted = `
SELECT last_created_unix FROM wf_status WHERE enrollment_id = ? AND workflow_name = ?`

	// Upsert through a derived table: portable to MySQL 8 and MariaDB,
	// where `INSERT … AS new` is MySQL-only and VALUES() is deprecated.
	qRecordWorkflowStarted = `
INSERT INTO wf_status (enrollment_id, workflow_name, last_created_unix)
SELECT * FROM (%s) AS v
ON DUPLICATE KEY UPDATE last_created_unix = v.u`
	qRecordWorkflowStartedFirst = `SELECT ? AS e, ? AS w, ? AS u`
	qRecordWorkflowStartedNext  = ` UNION ALL SELECT ?, ?, ?`

	qClearWorkflowStatus = `DELETE FROM wf_status WHERE enrollment_id = ?`

	qStoreEvent = `
INSERT INTO wf_events (event_name, event_type, workflow_name, event_context, context)
SELECT * FROM (SELECT ? AS n, ? AS t, ? AS w, ? AS ec, ? AS c) AS v
ON DUPLICATE KEY UPDATE
  event_type = v.t, workflow_name = v.w, event_context = v.ec, context = v.c`

	qGetEventsByNames = `
SELECT event_name, event_type, workflow_name, context, event_context
FROM wf_events WHERE event_name IN (?)`

	qGetEventsByType = `
SELECT event_name, event_type, workflow_name, context, event_context
FROM wf_events WHERE event_type = ? ORDER BY event_name`

	qDeleteEvent = `DELETE FROM wf_events WHERE event_name = ?`

	// Operators' control of delivery (operator_events.go). An event that
	// used up its attempts or its age is held: taken out of the claim's
	// reach (held_at) with its last error, until released by hand.
	qHoldEvent = `
UPDATE stepcollect_outbox SET last_error = ?, held_at = CURRENT_TIMESTAMP(6), lease_until = DEFAULT, retry_at = NULL
WHERE id = ? AND event_id = ?`

	// A release starts the event afresh: its count, its age and its state
	// (pending), due now.
	qReleaseEvent = `
UPDATE stepcollect_outbox
SET held_at = NULL, released_at = CURRENT_TIMESTAMP(6), attempts = 0, last_error = NULL, lease_until = DEFAULT, retry_at = NULL
WHERE event_id = ? AND held_at IS NOT NULL`

	// "Deliver now" ends a backoff; a delivery in flight (no retry_at) is
	// left alone, or the event would be posted twice at once.
	qDeliverEventNow = `
UPDATE stepcollect_outbox SET lease_until = DEFAULT, retry_at = NULL
WHERE event_id = ? AND held_at IS NULL AND retry_at IS NOT NULL`

	// The same for every event waiting out a backoff (EndBackoffs), in id
	// order along outbox_held_at's NULL entries, as claims lock them.
	qEndBackoffs = `
UPDATE stepcollect_outbox SET lease_until = DEFAULT, retry_at = NULL
WHERE held_at IS NULL AND retry_at IS NOT NULL ORDER BY id LIMIT ?`

	qOutboxHasEvent = `SELECT 1 FROM stepcollect_outbox WHERE event_id = ?`

	// GET /v1/events: one page after a cursor, oldest (lowest id) first.
	// The unfiltered and held pages walk PRIMARY and outbox_held_at; the
	// others outbox_held_at's NULL entries, which are in id order.
	qListEventsColumns = `
SELECT id, event_id, event_type, step_id, enrollment_id, created_at, attempts, last_error,
  held_at IS NOT NULL, IF(held_at IS NULL, retry_at, NULL)
FROM stepcollect_outbox `
	qListEvents        = qListEventsColumns + `WHERE id > ? ORDER BY id LIMIT ?`
	qListEventsPending = qListEventsColumns + `WHERE held_at IS NULL AND last_error IS NULL AND id > ? ORDER BY id LIMIT ?`
	qListEventsFailing = qListEventsColumns + `WHERE held_at IS NULL AND last_error IS NOT NULL AND id > ? ORDER BY id LIMIT ?`
	qListEventsHeld    = qListEventsColumns + `WHERE held_at IS NOT NULL AND id > ? ORDER BY id LIMIT ?`

	// Delivery paused or running, one row for every worker. The claim
	// reads it with a shared lock, so a pause waits for the claims that
	// saw "running" to commit, and no claim starts running after it.
	qGetDelivery    = `SELECT paused, since FROM stepcollect_delivery WHERE id = 1`
	qClaimsDelivery = `SELECT paused FROM stepcollect_delivery WHERE id = 1 LOCK IN SHARE MODE`
	qLockDelivery   = `SELECT paused, since FROM stepcollect_delivery WHERE id = 1 FOR UPDATE`
	// since moves only when the state changes (assigned before paused, so
	// it compares with the old value under either assignment order).
	qSetDelivery = `
UPDATE stepcollect_delivery SET since = IF(paused = ?, since, CURRENT_TIMESTAMP(6)), paused = ? WHERE id = 1`
	qEnsureDelivery = `INSERT IGNORE INTO stepcollect_delivery (id, paused, since) VALUES (1, 0, NULL)`

	// The character set of the engine's id columns (holdable.go). Non-locking.
	qIDCharset = `
SELECT CHARACTER_SET_NAME FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'id_commands' AND COLUMN_NAME = 'enrollment_id'`
)
