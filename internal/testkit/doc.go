// Package testkit is what stepcollect's tests build on, so that each test
// package writes none of it again: a migrated database of the test's own,
// opened the way the service opens it (db.go), and the storage on it, with
// a release sink that loses every hand-off (storage.go); a private
// redis-server (redis.go); the binaries built and run as processes
// (proc.go), and an api and a worker started together against a DSN and a
// Redis URL (stack.go); steps (steps.go), result plists and NanoMDM's
// webhook body (plist.go); a /v1 client (v1.go); a recording receiver of
// the events the worker POSTs (receiver.go, the bench's too); and one way
// to wait for what a test observes (wait.go).
//
// Where a server or a tool is missing a test is skipped, except under
// CI=true, where it fails: CI must never pass by skipping.
package testkit
