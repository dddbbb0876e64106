// Derived from NanoHUB v0.2.0's cmd/nanohub/storage.go:
//
// Copyright 2025 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanohub, LICENSE).

package nanohubapp

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cespare/xxhash"
	"github.com/go-sql-driver/mysql"
	dmstorage "github.com/jessepeterson/kmfddm/storage"
	dmfile "github.com/jessepeterson/kmfddm/storage/diskv"
	dminmem "github.com/jessepeterson/kmfddm/storage/inmem"
	dmmysql "github.com/jessepeterson/kmfddm/storage/mysql"
	cmdstorage "github.com/micromdm/nanocmd/engine/storage"
	cmdfile "github.com/micromdm/nanocmd/engine/storage/diskv"
	cmdinmem "github.com/micromdm/nanocmd/engine/storage/inmem"
	stgcmdplan "github.com/micromdm/nanocmd/subsystem/cmdplan/storage"
	stgcmdplandiskv "github.com/micromdm/nanocmd/subsystem/cmdplan/storage/diskv"
	stgcmdplaninmem "github.com/micromdm/nanocmd/subsystem/cmdplan/storage/inmem"
	stgfv "github.com/micromdm/nanocmd/subsystem/filevault/storage"
	stgfvdiskv "github.com/micromdm/nanocmd/subsystem/filevault/storage/diskv"
	stgfvinmem "github.com/micromdm/nanocmd/subsystem/filevault/storage/inmem"
	stgfvinvprk "github.com/micromdm/nanocmd/subsystem/filevault/storage/invprk"
	stginv "github.com/micromdm/nanocmd/subsystem/inventory/storage"
	stginvdiskv "github.com/micromdm/nanocmd/subsystem/inventory/storage/diskv"
	stginvinmem "github.com/micromdm/nanocmd/subsystem/inventory/storage/inmem"
	stgprof "github.com/micromdm/nanocmd/subsystem/profile/storage"
	stgprofdiskv "github.com/micromdm/nanocmd/subsystem/profile/storage/diskv"
	stgprofinmem "github.com/micromdm/nanocmd/subsystem/profile/storage/inmem"
	"github.com/micromdm/nanolib/log"
	mdmstorage "github.com/micromdm/nanomdm/storage"
	mdmfile "github.com/micromdm/nanomdm/storage/diskv"
	mdminmem "github.com/micromdm/nanomdm/storage/inmem"
	mdmmysql "github.com/micromdm/nanomdm/storage/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/collector"
	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/nanocmdapp/mysqlstore"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// ErrOptionsNotSupported is NanoHUB's answer to any -storage-options.
var ErrOptionsNotSupported = errors.New("options not supported")

// DMStore is what NanoHUB asks of KMFDDM's storage: the server's and the API's.
type DMStore interface {
	dmstorage.EnrollmentDeclarationStorage
	dmstorage.EnrollmentDeclarationDataStorage
	dmstorage.StatusStorer
	dmstorage.TokensJSONRetriever
	dmstorage.EnrollmentIDRetriever
	dmstorage.DeclarationAPIStorage
	dmstorage.SetRetreiver
	dmstorage.SetDeclarationStorage
	dmstorage.EnrollmentSetStorage
	dmstorage.StatusAPIStorage
}

var hasher = func() hash.Hash { return xxhash.New() }

// stores are every storage of one process: NanoMDM's, KMFDDM's, the
// engine's and the workflows' subsystems'.
type stores struct {
	mdm       mdmstorage.AllStorage
	dm        DMStore
	cmd       cmdstorage.AllStorage
	inventory stginv.Storage
	profile   stgprof.Storage
	cmdplan   stgcmdplan.Storage
	filevault stgfv.FVRotate

	// with -storage mysql
	steps   *stepmysql.Storage // its receipts pruned
	sweeper *collector.Sweeper
	close   func() error

	ready []httpapi.Check
}

// openStores opens cfg's storages; with -storage mysql their metrics go on reg.
func openStores(ctx context.Context, cfg *Config, logger log.Logger, zl zerolog.Logger, reg prometheus.Registerer) (*stores, error) {
	if cfg.StorageOptions != "" {
		return nil, ErrOptionsNotSupported
	}
	switch cfg.Storage {
	case "file":
		return fileStores(cfg.StorageDSN)
	case "inmem":
		inv := stginvinmem.New()
		fv, err := stgfvinmem.New(stgfvinvprk.NewInvPRK(inv))
		if err != nil {
			return nil, fmt.Errorf("creating filevault inmem storage: %w", err)
		}
		return &stores{
			mdm: mdminmem.New(), dm: dminmem.New(hasher), cmd: cmdinmem.New(),
			inventory: inv, profile: stgprofinmem.New(), cmdplan: stgcmdplaninmem.New(), filevault: fv,
			ready: []httpapi.Check{storageReport("inmem")},
		}, nil
	case "mysql":
		return mysqlStores(ctx, cfg, logger, zl, reg)
	}
	return nil, fmt.Errorf("unknown storage type: %s", cfg.Storage)
}

// fileStores are NanoHUB's, in the same folders under dsn (default "db").
func fileStores(dsn string) (*stores, error) {
	if dsn == "" {
		dsn = "db"
	} else {
		dsn = strings.TrimRight(dsn, string(os.PathSeparator))
	}
	if err := os.Mkdir(dsn, 0755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, err
	}
	inv := stginvdiskv.New(filepath.Join(dsn, "subsys-inventory"))
	fv, err := stgfvdiskv.New(filepath.Join(dsn, "subsys-fvkey"), stgfvinvprk.NewInvPRK(inv))
	if err != nil {
		return nil, fmt.Errorf("creating filevault diskv storage: %w", err)
	}
	return &stores{
		mdm:       mdmfile.New(filepath.Join(dsn, "mdm")),
		dm:        dmfile.New(filepath.Join(dsn, "dm"), hasher),
		cmd:       cmdfile.New(filepath.Join(dsn, "cmd")),
		inventory: inv,
		profile:   stgprofdiskv.New(filepath.Join(dsn, "subsys-profile")),
		cmdplan:   stgcmdplandiskv.New(filepath.Join(dsn, "subsys-cmdplan")),
		filevault: fv,
		ready:     []httpapi.Check{storageReport("file")},
	}, nil
}

// storageReport is /readyz's line for a storage with nothing to reach.
func storageReport(name string) httpapi.Check {
	return httpapi.Check{Name: "storage", Report: func(context.Context) string { return name }}
}

// mysqlStores are NanoMDM's and KMFDDM's own MySQL storages, as NanoHUB
// opens them, and stepcollect's for the engine (collection inline after
// each commit, a periodic sweep for what that missed) with mysqlstore's
// for every subsystem, all in the one database, every table created at
// start. A NanoHUB v0.2.0 database is adopted in place.
func mysqlStores(ctx context.Context, cfg *Config, logger log.Logger, zl zerolog.Logger, reg prometheus.Registerer) (_ *stores, err error) {
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
	if err := requireMySQL(startCtx, db); err != nil {
		return nil, err
	}
	if err := loadSchemas(startCtx, db); err != nil {
		return nil, err
	}
	if err := stepmysql.Migrate(startCtx, db); err != nil {
		return nil, err
	}
	if err := mysqlstore.Migrate(startCtx, db); err != nil {
		return nil, err
	}
	reg.MustRegister(collectors.NewDBStatsCollector(db, metrics.DBPoolName))

	mdmDB, dmDB, err := foreignPools(cfg.StorageDSN, cfg.Pool())
	if err != nil {
		return nil, err
	}
	closeAll := func() error { return errors.Join(mdmDB.Close(), dmDB.Close(), db.Close()) }
	defer func() {
		if err != nil {
			mdmDB.Close()
			dmDB.Close()
		}
	}()
	mdmStore, err := mdmmysql.New(mdmmysql.WithDB(mdmDB), mdmmysql.WithLogger(logger.With("storage", "mysql")))
	if err != nil {
		return nil, fmt.Errorf("opening NanoMDM's MySQL storage: %w", err)
	}
	dmStore, err := dmmysql.New(hasher, dmmysql.WithDB(dmDB))
	if err != nil {
		return nil, fmt.Errorf("opening KMFDDM's MySQL storage: %w", err)
	}

	// receipts: the engine learns of a completion only once, so a COMMIT
	// whose answer was lost is settled by evidence, not redone
	eng, err := stepmysql.New(stepmysql.WithDB(db), stepmysql.WithLogger(zl.With().Str("component", "storage").Logger()),
		stepmysql.WithObserver(metrics.NewStorage(reg)), stepmysql.WithReceipts())
	if err != nil {
		return nil, err
	}
	// no cmd/worker's scheduler claims this database's steps: NanoCMD's
	// engine worker in this process does
	if err := eng.MarkScheduleOwnedByEngine(startCtx); err != nil {
		return nil, err
	}
	inv := mysqlstore.NewInventory(db)
	fv, err := mysqlstore.NewFileVault(startCtx, db, stgfvinvprk.NewInvPRK(inv))
	if err != nil {
		return nil, err
	}
	return &stores{
		mdm: mdmStore, dm: dmStore, cmd: eng,
		inventory: inv, profile: mysqlstore.NewProfiles(db), cmdplan: mysqlstore.NewCMDPlans(db), filevault: fv,
		steps: eng,
		sweeper: collector.NewSweeper(collector.SweeperConfig{Interval: time.Duration(cfg.SweepInterval) * time.Second},
			eng, nil, metrics.NewSweeper(reg), zl.With().Str("component", "sweeper").Logger()),
		close: closeAll,
		ready: []httpapi.Check{httpapi.MySQLCheck(stepmysql.ReadyCheck(db), cfg.StorageDSN)},
	}, nil
}

// foreignPools are NanoMDM's and KMFDDM's storages' pools: their own, on
// the DSN as given (as in NanoHUB; KMFDDM's without interpolation), sized
// as stepcollect's.
func foreignPools(dsn string, pool stepmysql.Pool) (mdmDB, dmDB *sql.DB, err error) {
	dmDSN, err := withoutInterpolation(dsn)
	if err != nil {
		return nil, nil, fmt.Errorf("-storage-dsn: %w", err)
	}
	if mdmDB, err = sql.Open("mysql", dsn); err != nil {
		return nil, nil, fmt.Errorf("-storage-dsn: %w", err)
	}
	if dmDB, err = sql.Open("mysql", dmDSN); err != nil {
		mdmDB.Close()
		return nil, nil, fmt.Errorf("-storage-dsn: %w", err)
	}
	pool.Apply(mdmDB)
	pool.Apply(dmDB)
	return mdmDB, dmDB, nil
}

// withoutInterpolation is dsn with interpolateParams off: KMFDDM writes
// status reports as []byte into JSON columns, which the driver, when it
// interpolates, sends as _binary literals that MySQL refuses as JSON
// (error 3144), so no status report would be stored.
func withoutInterpolation(dsn string) (string, error) {
	mc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", err
	}
	mc.InterpolateParams = false
	return mc.FormatDSN(), nil
}
