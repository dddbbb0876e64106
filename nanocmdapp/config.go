// Derived from NanoCMD v0.7.1's cmd/nanocmd/main.go:
//
// Copyright 2023 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanocmd, LICENSE).

package nanocmdapp

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/hibiken/asynq"
	"github.com/micromdm/nanocmd/engine"
	"github.com/micromdm/nanolib/envflag"

	"github.com/stepcollect/stepcollect/internal/config"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// EnvPrefix is NanoCMD's: every flag -x-y has the fallback NANOCMD_X_Y.
const EnvPrefix = "NANOCMD_"

// Config is NanoCMD v0.7.1's command line, with the same names, meanings
// and defaults, and stepcollect's additions after it.
type Config struct {
	Debug          bool
	Listen         string
	Version        bool
	DumpWebhook    bool
	APIKey         string
	EnqueueURL     string
	PushURL        string
	EnqueueAPI     string
	Storage        string
	StorageDSN     string
	StorageOptions string
	MicroMDM       bool
	WorkerInterval uint // seconds; 0 disables the engine worker
	RePushInterval uint // seconds
	StepTimeout    uint // seconds

	// Additions.
	WebhookHMACKey string // NanoMDM's -webhook-hmac-key: X-Hmac-Signature checked when set
	SweepInterval  uint   // seconds between sweeps for uncollected steps (-storage mysql); 0 disables
	RedisURL       string // with -storage mysql: released steps handed to cmd/worker's queue, not collected here
	MaxURLBytes    int    // longest enqueue or push URL; a fan-out is split into steps whose ids fit one
	// with -storage mysql: the pool, as every stepcollect binary takes it
	MySQLMaxConns        int
	MySQLConnMaxLifetime time.Duration
	MySQLConnMaxIdleTime time.Duration
}

// FlagSet defines cfg's flags on a new flag set named name. Its -h output
// is NanoCMD's, two lines longer.
func FlagSet(name string, cfg *Config) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.BoolVar(&cfg.Debug, "debug", false, "log debug messages")
	fs.StringVar(&cfg.Listen, "listen", ":9003", "HTTP listen address")
	fs.BoolVar(&cfg.Version, "version", false, "print version and exit")
	fs.BoolVar(&cfg.DumpWebhook, "dump-webhook", false, "dump webhook input")
	fs.StringVar(&cfg.APIKey, "api", "", "API key for API endpoints")
	fs.StringVar(&cfg.EnqueueURL, "enqueue-url", "", "URL of MDM server enqueue endpoint")
	fs.StringVar(&cfg.PushURL, "push-url", "", "URL of MDM server push endpoint")
	fs.StringVar(&cfg.EnqueueAPI, "enqueue-api", "", "MDM server API key")
	fs.StringVar(&cfg.Storage, "storage", "file", "name of storage backend")
	fs.StringVar(&cfg.StorageDSN, "storage-dsn", "", "data source name (e.g. connection string or path)")
	fs.StringVar(&cfg.StorageOptions, "storage-options", "", "storage backend options")
	fs.BoolVar(&cfg.MicroMDM, "micromdm", false, "MicroMDM-style command submission")
	fs.UintVar(&cfg.WorkerInterval, "worker-interval", uint(engine.DefaultDuration/time.Second), "interval for worker in seconds")
	fs.UintVar(&cfg.RePushInterval, "repush-interval", uint(engine.DefaultRePushDuration/time.Second), "interval for repushes in seconds")
	fs.UintVar(&cfg.StepTimeout, "step-timeout", uint(engine.DefaultTimeout/time.Second), "default step timeout in seconds")

	fs.StringVar(&cfg.WebhookHMACKey, "webhook-hmac-key", "", "NanoMDM's -webhook-hmac-key: webhook bodies must carry its X-Hmac-Signature (none: not checked)")
	fs.UintVar(&cfg.SweepInterval, "sweep-interval", 30, "with -storage mysql: seconds between sweeps for steps left uncollected; 0 disables")
	fs.StringVar(&cfg.RedisURL, "redis-url", "", "with -storage mysql: hand released steps to stepcollect's worker through this Redis (redis://, rediss:// or redis-sentinel://) instead of collecting them here; the worker sweeps")
	fs.IntVar(&cfg.MySQLMaxConns, "mysql-max-conns", stepmysql.DefaultPoolSize, "with -storage mysql: most MySQL connections this process opens (every replica's count adds up against max_connections)")
	fs.DurationVar(&cfg.MySQLConnMaxLifetime, "mysql-conn-max-lifetime", stepmysql.DefaultConnMaxLifetime, "with -storage mysql: close a MySQL connection this long after it was opened, so a failover or a proxy's rebalancing reaches it; 0: never")
	fs.DurationVar(&cfg.MySQLConnMaxIdleTime, "mysql-conn-max-idle-time", stepmysql.DefaultConnMaxIdleTime, "with -storage mysql: give an idle MySQL connection back to the server after this long; 0: never")
	fs.IntVar(&cfg.MaxURLBytes, "enqueue-max-url-bytes", DefaultMaxURLBytes, "longest enqueue or push URL sent to the MDM server: a workflow started for more ids runs as several steps, each command enqueued once to as many ids as fit")
	return fs
}

// ErrHelp is returned by Parse for -h.
var ErrHelp = flag.ErrHelp

// Parse reads args with the NANOCMD_ environment of environ as fallbacks,
// as NanoCMD does (-version has none). Usage and errors go to out.
func Parse(name string, args, environ []string, out io.Writer) (*Config, error) {
	cfg := &Config{}
	fs := FlagSet(name, cfg)
	fs.SetOutput(out)
	if err := envflag.ParseFlagSet(fs, args, EnvPrefix, environ, []string{"version"}); err != nil {
		return nil, err
	}
	// the flag package has printed its own complaints; these are ours
	if err := check(fs, cfg); err != nil {
		fmt.Fprintln(out, err)
		return nil, err
	}
	return cfg, nil
}

// check refuses what the flag package accepts but the server cannot use.
func check(fs *flag.FlagSet, cfg *Config) error {
	if fs.NArg() > 0 {
		return errors.New("unexpected arguments: " + fs.Arg(0))
	}
	if cfg.MySQLMaxConns < 2 {
		return fmt.Errorf("-mysql-max-conns: %d is less than 2", cfg.MySQLMaxConns)
	}
	if cfg.MySQLConnMaxLifetime < 0 || cfg.MySQLConnMaxIdleTime < 0 {
		return errors.New("-mysql-conn-max-lifetime, -mysql-conn-max-idle-time: negative (0 for never)")
	}
	if cfg.MaxURLBytes < 256 {
		return fmt.Errorf("-enqueue-max-url-bytes: %d is under 256, too short for an id after the URL", cfg.MaxURLBytes)
	}
	if cfg.RedisURL != "" {
		if cfg.Storage != "mysql" {
			return fmt.Errorf("-redis-url: only with -storage mysql (not %q): the worker collects from the database", cfg.Storage)
		}
		if _, err := asynq.ParseRedisURI(cfg.RedisURL); err != nil {
			return fmt.Errorf("-redis-url: %w", config.RedactError(err, cfg.RedisURL))
		}
	}
	return nil
}
