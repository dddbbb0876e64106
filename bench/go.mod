module github.com/stepcollect/stepcollect/bench

go 1.26.0

require (
	github.com/go-sql-driver/mysql v1.9.3
	github.com/micromdm/nanocmd v0.7.1
	github.com/stepcollect/stepcollect v0.0.0
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/mattn/go-colorable v0.1.13 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/mfridman/interpolate v0.0.2 // indirect
	github.com/micromdm/nanolib v0.5.2 // indirect
	github.com/pressly/goose/v3 v3.26.0 // indirect
	github.com/rs/zerolog v1.34.0 // indirect
	github.com/sethvargo/go-retry v0.3.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

replace github.com/stepcollect/stepcollect => ../
