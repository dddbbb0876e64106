# stepcollect. Two commands to know: `make run` and `make test`.
SHELL := /bin/bash
GO    ?= go
BENCH_N ?= 3000

.PHONY: run build test services bench bench-build vet

# Brings up MySQL/MariaDB and Redis where they do not answer, creates the
# database, then runs the services in the foreground (Ctrl-C stops them).
run: services build
	bin/migrate
	@bash scripts/run.sh

build:
	mkdir -p bin
	$(GO) build -o bin/ ./cmd/... ./internal/cmd/migrate

test: vet
	$(GO) test -race -count=1 ./...

vet:
	@unformatted=$$(gofmt -l . bench); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd bench && $(GO) vet ./...

services:
	bash scripts/services.sh

# One fan-out run per implementation, side by side on the local server.
bench: services bench-build
	cd bench && $(GO) run ./cmd/benchtable -bin ../bin/bench -n $(BENCH_N) -out ../docs/bench/fanout.md

bench-build:
	mkdir -p bin/bench
	cd bench && $(GO) build -o ../bin/bench/fanout-stepcollect ./cmd/fanout-stepcollect
	cd bench && $(GO) build -o ../bin/bench/fanout-nanocmd-v0.7.1 ./cmd/fanout-nanocmd
	cd bench && $(GO) build -modfile=go.v070.mod -o ../bin/bench/fanout-nanocmd-v0.7.0 ./cmd/fanout-nanocmd
