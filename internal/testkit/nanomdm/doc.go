// Package nanomdm runs NanoMDM's own server (v0.9.0, the version go.mod
// requires) for a test: built once per test binary, started on a free
// port with a CA of its own and -cert-header, killed when the test ends.
// Devices of package mdmsim enroll in it with identity certificates from
// that CA; Webhook records what it posts.
//
// What NanoMDM's enqueue API answers (the tests record it, on inmem,
// filekv and file storage, and on MySQL where one runs):
//
//   - A test server has no APNs push certificate, so the push after every
//     enqueue fails, and the enqueue is answered 500 with a top-level
//     "push_error" ("retrieving push cert for topic …"), no
//     "command_error", and the command's "command_uuid" and
//     "request_type": the command WAS enqueued, and the device gets it at
//     its next poll. ?nopush=1 (EnqueueNoPush) skips the push: 200 with
//     "no_push": true.
//   - A CommandUUID NanoMDM already holds, to any ids, is refused on the
//     key-value storages (inmem, filekv): 500 with "command_error":
//     "command already exists: <uuid>", no push tried, nothing queued. On
//     MySQL: 500 with "command_error": "Error 1062 (23000): Duplicate
//     entry '<uuid>' for key 'commands.PRIMARY'". The deprecated file
//     storage accepts it (queued again, answered as a first enqueue).
//   - An id NanoMDM does not know is queued to all the same: 500 with no
//     top-level error and "status": {"<id>": {"push_error": "push data
//     missing for id"}}; the uuid is then taken.
//   - A request without an identity certificate from the CA is refused
//     before it is read: 400 Bad Request.
//   - On the key-value storages a command answered NotNow is lost once the
//     command queued after it is answered: the queue unlinks the last
//     command without clearing its predecessor's link to it, hands it out
//     again, and unlinking it twice empties the queue. MySQL hands the
//     NotNow command out until it is answered.
//
// NanoMDM's MySQL storage runs on MySQL only (its `INSERT … AS new` is
// not MariaDB's): NewMySQLDB loads its schema into a fresh database, and
// skips on MariaDB.
package nanomdm
