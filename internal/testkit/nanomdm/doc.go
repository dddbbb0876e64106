// Package nanomdm runs NanoMDM's own server (v0.9.0, the version go.mod
// requires) for a test: built once per test binary, started on a free
// port with a CA of its own and -cert-header, killed when the test ends.
// Devices of package mdmsim enroll in it with identity certificates from
// that CA; Webhook records what it posts. What its enqueue API answers, as
// the tests record it, is tabled in docs/design.md, "Fan-outs through
// NanoMDM". Its MySQL storage is MySQL's only: NewMySQLDB loads its schema
// into a fresh database, and skips on MariaDB. Its key-value queues lose a
// command answered NotNow once the next is answered (a test records it).
package nanomdm
