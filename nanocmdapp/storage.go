// Derived from NanoCMD v0.7.1's cmd/nanocmd/storage.go:
//
// Copyright 2023 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanocmd, LICENSE).

package nanocmdapp

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/hibiken/asynq"
	storageeng "github.com/micromdm/nanocmd/engine/storage"
	storageengdiskv "github.com/micromdm/nanocmd/engine/storage/diskv"
	storageenginmem "github.com/micromdm/nanocmd/engine/storage/inmem"
	storagecmdplan "github.com/micromdm/nanocmd/subsystem/cmdplan/storage"
	storagecmdplandiskv "github.com/micromdm/nanocmd/subsystem/cmdplan/storage/diskv"
	storagecmdplaninmem "github.com/micromdm/nanocmd/subsystem/cmdplan/storage/inmem"
	storagefv "github.com/micromdm/nanocmd/subsystem/filevault/storage"
	storagefvdiskv "github.com/micromdm/nanocmd/subsystem/filevault/storage/diskv"
	storagefvinmem "github.com/micromdm/nanocmd/subsystem/filevault/storage/inmem"
	storagefvinvprk "github.com/micromdm/nanocmd/subsystem/filevault/storage/invprk"
	storageinv "github.com/micromdm/nanocmd/subsystem/inventory/storage"
	storageinvdiskv "github.com/micromdm/nanocmd/subsystem/inventory/storage/diskv"
	storageinvinmem "github.com/micromdm/nanocmd/subsystem/inventory/storage/inmem"
	storageprof "github.com/micromdm/nanocmd/subsystem/profile/storage"
	storageprofdiskv "github.com/micromdm/nanocmd/subsystem/profile/storage/diskv"
	storageprofinmem "github.com/micromdm/nanocmd/subsystem/profile/storage/inmem"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/config"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/nanocmdapp/mysqlstore"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
	"github.com/stepcollect/stepcollect/tasks"
)

type storageConfig struct {
	inventory storageinv.Storage
	engine    storageeng.AllStorage
	profile   storageprof.Storage
	cmdplan   storagecmdplan.Storage
	event     storageeng.EventSubscriptionStorage
	filevault storagefv.FVRotate

	// with -storage mysql: the sweeper when steps are collected here, or
	// the hand-off to the worker's queue with -redis-url
	sweeper *collector.Sweeper
	handoff *collector.Handoff
	steps   *stepmysql.Storage // its receipts pruned
	close   func() error

	// ready is what /readyz asks of this storage
	ready []httpapi.Check
}

// Pool is the MySQL pool of -storage mysql cfg asks for.
func (cfg *Config) Pool() stepmysql.Pool {
	return stepmysql.Pool{MaxConns: cfg.MySQLMaxConns, MaxLifetime: cfg.MySQLConnMaxLifetime, MaxIdleTime: cfg.MySQLConnMaxIdleTime}
}

// parseStorage opens cfg's storage; with -storage mysql its metrics go on reg.
func parseStorage(ctx context.Context, cfg *Config, zl zerolog.Logger, reg prometheus.Registerer) (*storageConfig, error) {
	name, dsn := cfg.Storage, cfg.StorageDSN
	switch name {
	case "inmem":
		inv := storageinvinmem.New()
		fv, err := storagefvinmem.New(storagefvinvprk.NewInvPRK(inv))
		if err != nil {
			return nil, fmt.Errorf("creating filevault inmem storage: %w", err)
		}
		eng := storageenginmem.New()
		return &storageConfig{
			engine:    eng,
			inventory: inv,
			profile:   storageprofinmem.New(),
			cmdplan:   storagecmdplaninmem.New(),
			event:     eng,
			filevault: fv,
			ready:     []httpapi.Check{storageReport(name)},
		}, nil
	case "file", "diskv":
		if dsn == "" {
			dsn = "db"
		}
		inv := storageinvdiskv.New(filepath.Join(dsn, "inventory"))
		fv, err := storagefvdiskv.New(filepath.Join(dsn, "fvkey"), storagefvinvprk.NewInvPRK(inv))
		if err != nil {
			return nil, fmt.Errorf("creating filevault diskv storage: %w", err)
		}
		eng := storageengdiskv.New(dsn)
		return &storageConfig{
			engine:    eng,
			inventory: inv,
			profile:   storageprofdiskv.New(filepath.Join(dsn, "profile")),
			cmdplan:   storagecmdplandiskv.New(filepath.Join(dsn, "cmdplan")),
			event:     eng,
			filevault: fv,
			ready:     []httpapi.Check{storageReport(name)},
		}, nil
	case "mysql":
		return mysqlStorage(ctx, cfg, zl, reg)
	}
	return nil, fmt.Errorf("unknown storage: %s", name)
}

// storageReport is /readyz's line for NanoCMD's own storages: nothing to
// reach, so always ready, but the body says which storage answers.
func storageReport(name string) httpapi.Check {
	return httpapi.Check{Name: "storage", Report: func(context.Context) string { return name }}
}

// mysqlStorage is every storage on the one database: stepcollect's for the
// engine (collection inline after each commit, a periodic sweep for what
// that missed; or, with -redis-url, handed to the worker's queue),
// mysqlstore's for the subsystems. Both schemas are applied
// at start; a NanoCMD v0.7.1 database is adopted in place.
func mysqlStorage(ctx context.Context, cfg *Config, zl zerolog.Logger, reg prometheus.Registerer) (_ *storageConfig, err error) {
	if cfg.StorageDSN == "" {
		return nil, errors.New("-storage mysql: -storage-dsn is required")
	}
	db, err := stepmysql.OpenDB(cfg.StorageDSN)
	if err != nil {
		return nil, fmt.Errorf("-storage-dsn: %w", err)
	}
	defer func() {
		if err != nil {
			db.Close()
		}
	}()
	cfg.Pool().Apply(db)
	startCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := stepmysql.Migrate(startCtx, db); err != nil {
		return nil, err
	}
	if err := mysqlstore.Migrate(startCtx, db); err != nil {
		return nil, err
	}
	reg.MustRegister(collectors.NewDBStatsCollector(db, metrics.DBPoolName))
	// receipts: the engine learns of a completion only from the webhook's
	// answer, so a COMMIT whose answer was lost must be settled by evidence
	// (a 500 loses the result: NanoMDM does not resend)
	opts := []stepmysql.Option{stepmysql.WithDB(db), stepmysql.WithLogger(zl.With().Str("component", "storage").Logger()),
		stepmysql.WithObserver(metrics.NewStorage(reg)), stepmysql.WithReceipts()}
	var (
		handoff *collector.Handoff
		enq     *tasks.Enqueuer
	)
	if cfg.RedisURL != "" {
		if handoff, enq, err = newHandoff(startCtx, cfg.RedisURL, db, reg, zl); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				enq.Close()
			}
		}()
		opts = append(opts, stepmysql.WithReleaseSink(handoff))
	}
	eng, err := stepmysql.New(opts...)
	if err != nil {
		return nil, err
	}
	// before anything is served: from here on no cmd/worker's scheduler
	// claims this database's steps (NanoCMD's engine worker does)
	if err := eng.MarkScheduleOwnedByEngine(startCtx); err != nil {
		return nil, err
	}
	inv := mysqlstore.NewInventory(db)
	fv, err := mysqlstore.NewFileVault(startCtx, db, storagefvinvprk.NewInvPRK(inv))
	if err != nil {
		return nil, err
	}
	sc := &storageConfig{
		steps:     eng,
		engine:    eng,
		inventory: inv,
		profile:   mysqlstore.NewProfiles(db),
		cmdplan:   mysqlstore.NewCMDPlans(db),
		event:     eng,
		filevault: fv,
		close:     db.Close,
		ready:     []httpapi.Check{httpapi.MySQLCheck(stepmysql.ReadyCheck(db), cfg.StorageDSN, cfg.RedisURL)},
	}
	if handoff != nil {
		sc.handoff = handoff
		sc.close = func() error { enq.Close(); return db.Close() }
		// as for the api: results commit while Redis is down
		sc.ready = append(sc.ready, httpapi.RedisCheck(enq.Ping, true, cfg.StorageDSN, cfg.RedisURL))
		return sc, nil
	}
	sc.sweeper = collector.NewSweeper(collector.SweeperConfig{Interval: time.Duration(cfg.SweepInterval) * time.Second},
		eng, nil, metrics.NewSweeper(reg), zl.With().Str("component", "sweeper").Logger())
	return sc, nil
}

// newHandoff is the api's hand-off onto the worker's queue at redisURL:
// each commit's released steps are batched off the request path; Redis
// being down delays collection (the worker's sweep is the backstop), never
// a result. Its failures and drops are counted on reg, as the api's. The
// queue is the one db's deployment names (stepmysql.QueueNamespace), as
// the worker on the same database reads it.
func newHandoff(ctx context.Context, redisURL string, db *sql.DB, reg prometheus.Registerer, zl zerolog.Logger) (*collector.Handoff, *tasks.Enqueuer, error) {
	redisOpt, err := asynq.ParseRedisURI(redisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("-redis-url: %w", config.RedactError(err, redisURL))
	}
	ns, err := stepmysql.QueueNamespace(ctx, db)
	if err != nil {
		return nil, nil, fmt.Errorf("-storage-dsn: %w", err)
	}
	m := metrics.NewEnqueue(reg, tasks.TaskTypes()...)
	enq := tasks.NewEnqueuer(redisOpt, tasks.WithNamespace(tasks.NewNamespace(tasks.NamesFor(ns))), tasks.OnEnqueueFailure(m.Failed))
	h := collector.NewHandoff(collector.HandoffConfig{OnDrop: func(n int) { m.HandoffDropped.Add(float64(n)) }},
		enq, zl.With().Str("component", "handoff").Logger())
	return h, enq, nil
}
