# stepcollect. Two commands to know: `make run` and `make test`.
SHELL := /bin/bash
GO    ?= go

.PHONY: run build test test-mysql services bench bench-build vet

# Brings up MySQL/MariaDB and Redis where they do not answer, creates the
# database, then runs the services in the foreground (Ctrl-C stops them).
run: services build
	bin/migrate
	@bash scripts/run.sh

# What -version prints and stepcollect_build_info say beside the version
# (internal/version.Release): the commit and the build time, stamped into
# the binaries (the Dockerfile takes the same as build args).
VERSION_LDFLAGS = -X github.com/stepcollect/stepcollect/internal/version.commit=$(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown) \
                  -X github.com/stepcollect/stepcollect/internal/version.date=$(shell date -u +%Y-%m-%dT%H:%M:%SZ)

build:
	mkdir -p bin
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o bin/ ./cmd/...

test: vet
	$(GO) test -race -count=1 ./...
	cd bench && $(GO) test -count=1 ./cmd/bench
	@$(MAKE) --no-print-directory fuzz

# The suites that use the database again, on MySQL 9.7 LTS beside `make
# test`'s MariaDB: scripts/mysql.sh brings it up on 127.0.0.1:3307 (a chroot,
# made once, as root) where it does not answer. `make run` never needs it.
# e2e/failover and testha start a private server of the suite's kind: a
# mysqld of their own from the same chroot here, a mariadbd in `make test`
# (which never needs the chroot).
MYSQL_TEST_DSN  ?= root@tcp(127.0.0.1:3307)/
MYSQL_TEST_PKGS ?= ./storage/... ./httpapi ./app ./collector ./delivery ./cmd/... ./nanocmdapp/... ./nanohubapp ./examples ./deploy \
                   ./e2e ./e2e/pace ./e2e/recovery ./e2e/failover ./internal/testkit/testha ./internal/testkit/nanomdm
test-mysql:
	bash scripts/services.sh --mysql
	STEPCOLLECT_TEST_MYSQL_DSN='$(MYSQL_TEST_DSN)' $(GO) test -race -count=1 $(MYSQL_TEST_PKGS)

# A short run of each fuzz target (go fuzzes one target of one package per
# command) after the tests. What a run finds is kept in the package's
# testdata/fuzz, to be fixed and committed.
#
# Each budget is a count of executions (about ten seconds each on the
# 2-CPU CI machine), not a duration: go1.26's fuzz coordinator can report
# its own -fuzztime deadline as a failure ("context deadline exceeded" and
# no failing input, golang/go#75804, fixed in Go 1.27), which failed CI
# once on FuzzDecodeStep. A count sets no deadline to race.
# FUZZTIME=2000000x (or a duration, with that race) overrides all three
# for a longer look.
FUZZTIME ?=
FUZZ_PLIST_EXECS   ?= 300000x
FUZZ_WEBHOOK_EXECS ?= 100000x
FUZZ_STEP_EXECS    ?= 60000x
.PHONY: fuzz
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzTopLevelStrings$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_PLIST_EXECS)) ./internal/mdmplist
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeWebhook$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_WEBHOOK_EXECS)) ./httpapi
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeStep$$' -fuzztime $(or $(FUZZTIME),$(FUZZ_STEP_EXECS)) ./httpapi

vet: lint-tools
	@unformatted=$$(gofmt -l . bench); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...
	cd bench && $(GO) vet ./...
	$(STATICCHECK) ./...
	cd bench && $(STATICCHECK) ./...

# staticcheck, pinned, installed from the Go module proxy when this exact
# version is not on the PATH or in GOBIN. The proxy serves it by its module
# version (v0.8.2), not by its release name (2026.2.2): ask for the first,
# check the second.
STATICCHECK_VERSION ?= 2026.2.2
STATICCHECK_MODULE_VERSION ?= v0.8.2
GOBIN_DIR := $(shell $(GO) env GOBIN)
GOBIN_DIR := $(if $(GOBIN_DIR),$(GOBIN_DIR),$(shell $(GO) env GOPATH)/bin)
STATICCHECK ?= $(GOBIN_DIR)/staticcheck
.PHONY: lint-tools
lint-tools:
	@if ! $(STATICCHECK) -version 2>/dev/null | grep -q '^staticcheck $(STATICCHECK_VERSION) '; then \
		echo "installing staticcheck $(STATICCHECK_VERSION)"; \
		$(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_MODULE_VERSION); \
	fi

services:
	bash scripts/services.sh

# stepcollect side by side with NanoCMD v0.7.0 and v0.7.1, the floor and the
# service, on a private mariadbd, and the same fan-out rows on the MySQL at
# BENCH_MYSQL_DSN (scripts/mysql.sh's; BENCH_MYSQL_DSN= skips them); each
# server also with the binary log written (sync_binlog=1); and NanoCMD's
# inventory workflow through NanoMDM's own server (bin/bench/nanomdm) to 500
# simulated Macs (-realstack-n; -only realstack runs it alone); and, with
# BENCH_MYSQL_DSN, NanoHUB v0.2.0's own binary beside stepcollect's
# nanohub, 500 simulated Macs answering one step (-nanohub-n; -only
# nanohub). Writes docs/bench/results.md and charts.
# BENCH_N=25,300 BENCH_FLAGS=-skip-large-table for a quick look.
BENCH_N ?= 25,100,300,3000,10000
BENCH_MYSQL_DSN ?= root@tcp(127.0.0.1:3307)/
# stepcollect's rows on a private three-node Galera cluster too, where
# galera-4 is installed (.ci/run installs it); BENCH_GALERA= skips them
BENCH_GALERA ?= $(wildcard /usr/lib/galera/libgalera_smm.so)
# and on a private three-member MySQL Group Replication group, where
# scripts/mysql.sh's chroot is (BENCH_GROUP= skips them)
BENCH_GROUP ?= $(wildcard /var/lib/stepcollect-mysql-chroot/usr/lib/mysql/plugin/group_replication.so)
# where results.md goes, relative to bench/ (a run of some rows alone:
# BENCH_FLAGS='-only dropin' BENCH_OUT=../docs/bench/dropin)
BENCH_OUT ?= ../docs/bench
bench: bench-build
	cd bench && $(GO) run ./cmd/bench -bin ../bin/bench -n $(BENCH_N) -out $(BENCH_OUT) \
		$(if $(BENCH_MYSQL_DSN),-mysql-dsn '$(BENCH_MYSQL_DSN)') $(if $(BENCH_GALERA),-galera) \
		$(if $(BENCH_GROUP),-group-replication) $(BENCH_FLAGS)

# NanoHUB v0.2.0 is installed from its own go.mod (NanoCMD v0.7.0), outside
# this module: built inside it, it would get NanoCMD v0.7.1 and behave
# differently.
bench-build:
	mkdir -p bin/bench
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o bin/bench/ ./cmd/api ./cmd/worker
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o bin/bench/stepcollect-nanocmd ./cmd/nanocmd
	$(GO) build -ldflags "$(VERSION_LDFLAGS)" -o bin/bench/stepcollect-nanohub ./cmd/nanohub
	cd /tmp && GOFLAGS= GOBIN=$(CURDIR)/bin/bench $(GO) install github.com/micromdm/nanohub/cmd/nanohub@v0.2.0
	cp nanohubapp/kmfddm_schema.sql bin/bench/kmfddm-schema.sql
	cd bench && $(GO) build -o ../bin/bench/fanout-stepcollect ./cmd/fanout-stepcollect
	cd bench && $(GO) build -o ../bin/bench/fanout-nanocmd-v0.7.1 ./cmd/fanout-nanocmd
	cd bench && $(GO) build -modfile=go.v070.mod -o ../bin/bench/fanout-nanocmd-v0.7.0 ./cmd/fanout-nanocmd
	cd bench && $(GO) build -o ../bin/bench/nanocmd github.com/micromdm/nanocmd/cmd/nanocmd
	$(GO) build -o bin/bench/nanomdm github.com/micromdm/nanomdm/cmd/nanomdm
	rm -f bin/bench/nanocmd-schema.sql
	d=$$(cd bench && $(GO) list -m -f '{{.Dir}}' github.com/micromdm/nanocmd) && \
		cat $$d/engine/storage/mysql/schema.sql $$d/subsystem/profile/storage/mysql/schema.sql > bin/bench/nanocmd-schema.sql
