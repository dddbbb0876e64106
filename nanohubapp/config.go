// Derived from NanoHUB v0.2.0's cmd/nanohub/nanohub.go:
//
// Copyright 2025 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanohub, LICENSE).

package nanohubapp

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/micromdm/nanocmd/engine"
	"github.com/micromdm/nanolib/envflag"

	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// EnvPrefix is NanoHUB's: every flag -x-y has the fallback NANOHUB_X_Y.
const EnvPrefix = "NANOHUB_"

// Pool is the pool -storage mysql gives each of the process's pools.
func (cfg *Config) Pool() stepmysql.Pool {
	return stepmysql.Pool{MaxConns: cfg.MySQLMaxConns, MaxLifetime: cfg.MySQLConnMaxLifetime, MaxIdleTime: cfg.MySQLConnMaxIdleTime}
}

// Config is NanoHUB v0.2.0's command line, with the same names, meanings
// and defaults, and stepcollect's addition after it.
type Config struct {
	Listen         string
	Checkin        bool
	Version        bool
	Debug          bool
	Storage        string
	StorageDSN     string
	StorageOptions string
	CAPath         string
	IntPath        string
	Dump           bool
	CertHeader     string
	APIKey         string
	DMShard        bool
	WebhookURL     string
	AuthProxyURL   string
	UAZLChallenge  bool
	Migration      bool
	WorkerInterval uint // seconds; 0 disables the engine worker
	RePushInterval uint // seconds
	Retro          bool

	// Addition.
	SweepInterval uint // seconds between sweeps for uncollected steps (-storage mysql); 0 disables
	// with -storage mysql: each pool of the process, as every stepcollect binary takes it
	MySQLMaxConns        int
	MySQLConnMaxLifetime time.Duration
	MySQLConnMaxIdleTime time.Duration
}

// FlagSet defines cfg's flags on a new flag set named name. Its -h output
// is NanoHUB's, one flag longer.
func FlagSet(name string, cfg *Config) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&cfg.Listen, "listen", ":9004", "HTTP listen address")
	fs.BoolVar(&cfg.Checkin, "checkin", false, "enable separate HTTP endpoint for MDM check-ins")
	fs.BoolVar(&cfg.Version, "version", false, "print version and exit")
	fs.BoolVar(&cfg.Debug, "debug", false, "log debug messages")
	fs.StringVar(&cfg.Storage, "storage", "file", "storage backend")
	fs.StringVar(&cfg.StorageDSN, "storage-dsn", "", "storage backend data source name")
	fs.StringVar(&cfg.StorageOptions, "storage-options", "", "storage backend options")
	fs.StringVar(&cfg.CAPath, "ca", "", "path to PEM CA cert(s)")
	fs.StringVar(&cfg.IntPath, "intermediate", "", "path to PEM intermediate cert(s)")
	fs.BoolVar(&cfg.Dump, "dump", false, "dump MDM requests and responses to stdout")
	fs.StringVar(&cfg.CertHeader, "cert-header", "", "HTTP header containing TLS client certificate")
	fs.StringVar(&cfg.APIKey, "api-key", "", "API key for API endpoints")
	fs.BoolVar(&cfg.DMShard, "dmshard", false, "enable DM shard management properties declaration")
	fs.StringVar(&cfg.WebhookURL, "webhook-url", "", "URL to send requests to")
	fs.StringVar(&cfg.AuthProxyURL, "auth-proxy-url", "", "Reverse proxy URL target for MDM-authenticated HTTP requests")
	fs.BoolVar(&cfg.UAZLChallenge, "ua-zl-dc", false, "reply with zero-length DigestChallenge for UserAuthenticate")
	fs.BoolVar(&cfg.Migration, "migration", false, "HTTP endpoint for enrollment migrations")
	fs.UintVar(&cfg.WorkerInterval, "worker-interval", uint(engine.DefaultDuration/time.Second), "interval for worker in seconds")
	fs.UintVar(&cfg.RePushInterval, "repush-interval", uint(engine.DefaultRePushDuration/time.Second), "interval for repushes in seconds")
	fs.BoolVar(&cfg.Retro, "retro", false, "Allow retroactive certificate-authorization association")

	fs.IntVar(&cfg.MySQLMaxConns, "mysql-max-conns", stepmysql.DefaultPoolSize, "with -storage mysql: most MySQL connections each of this process's pools opens (stepcollect's, NanoMDM's, KMFDDM's; every replica's count adds up against max_connections)")
	fs.DurationVar(&cfg.MySQLConnMaxLifetime, "mysql-conn-max-lifetime", stepmysql.DefaultConnMaxLifetime, "with -storage mysql: close a MySQL connection this long after it was opened, so a failover or a proxy's rebalancing reaches it; 0: never")
	fs.DurationVar(&cfg.MySQLConnMaxIdleTime, "mysql-conn-max-idle-time", stepmysql.DefaultConnMaxIdleTime, "with -storage mysql: give an idle MySQL connection back to the server after this long; 0: never")
	fs.UintVar(&cfg.SweepInterval, "sweep-interval", 30, "with -storage mysql: seconds between sweeps for steps left uncollected; 0 disables")
	return fs
}

// ErrHelp is returned by Parse for -h.
var ErrHelp = flag.ErrHelp

// Parse reads args with the NANOHUB_ environment of environ as fallbacks,
// as NanoHUB does (-version has none). Usage and errors go to out.
func Parse(name string, args, environ []string, out io.Writer) (*Config, error) {
	cfg := &Config{}
	fs := FlagSet(name, cfg)
	fs.SetOutput(out)
	if err := envflag.ParseFlagSet(fs, args, EnvPrefix, environ, []string{"version"}); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		err := errors.New("unexpected arguments: " + fs.Arg(0))
		fmt.Fprintln(out, err)
		return nil, err
	}
	return cfg, nil
}
