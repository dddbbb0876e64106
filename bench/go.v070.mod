// NanoCMD v0.7.0 (before the step-collection change), for
//   go build -modfile=go.v070.mod ./cmd/fanout-nanocmd
// One build holds one version of a module, and stepcollect itself needs
// v0.7.1, so this file lists only what that one command needs.
module github.com/stepcollect/stepcollect/bench

go 1.26

require (
	github.com/go-sql-driver/mysql v1.9.3
	github.com/micromdm/nanocmd v0.7.0
)

require filippo.io/edwards25519 v1.1.0 // indirect
