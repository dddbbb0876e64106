package app

// A process that starts before MySQL answers (a host that boots both, a
// database restarted with the pods, a container whose name does not
// resolve yet) waits for it instead of exiting: its listeners are bound
// first and answer what a process starting can, and the pool's first ping
// is tried again until it succeeds, the signal to stop comes, or MySQL
// refuses the credentials, which no wait mends.

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/config"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

// startGate is a listener's handler from the moment it is bound. /healthz
// and /version are answered at once, whatever MySQL does (a liveness probe
// must not wait on the database). Any other request waits until the start
// is decided: either the real handler is there (open), and takes it, as
// if the listener had only been bound then; or a ping failed (wait), and
// it gets httpapi.Starting's answer naming why, until open.
type startGate struct {
	next     atomic.Pointer[http.Handler]
	waiting  atomic.Pointer[string]
	decided  chan struct{} // closed by the first wait or open
	decide   func()
	starting http.Handler
}

func newStartGate(logger zerolog.Logger) *startGate {
	g := &startGate{decided: make(chan struct{})}
	g.decide = sync.OnceFunc(func() { close(g.decided) })
	why := "connecting to MySQL"
	g.waiting.Store(&why)
	g.starting = httpapi.Starting(logger.With().Str("component", "http").Logger(), func() string { return *g.waiting.Load() })
	return g
}

// wait sets what /readyz and the other answers name as the reason.
func (g *startGate) wait(why string) { g.waiting.Store(&why); g.decide() }

// open hands every request from now on to h.
func (g *startGate) open(h http.Handler) { g.next.Store(&h); g.decide() }

func (g *startGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := g.next.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if r.URL.Path != "/healthz" && r.URL.Path != "/version" {
		select {
		case <-g.decided:
		case <-r.Context().Done():
			return
		}
		if h := g.next.Load(); h != nil {
			(*h).ServeHTTP(w, r)
			return
		}
	}
	g.starting.ServeHTTP(w, r)
}

// Bounds of the wait between two pings at start: the first retry comes
// soon (a server a moment from ready), later ones no more often than
// this, and a ping that hangs (a host that drops packets) is given up
// after pingTimeout.
const (
	firstPingRetry = 250 * time.Millisecond
	maxPingRetry   = 5 * time.Second
	pingTimeout    = 5 * time.Second
	// how often the wait is logged again after its first line
	waitLogEvery = 30 * time.Second
)

// waitForMySQL pings db until it answers. A database that does not exist
// yet is created first when migrate is set (a fresh server); without it
// the process waits for whoever migrates. Every failed ping's reason goes
// to report, secrets redacted (the gate's /readyz), and to the log once
// and then every waitLogEvery. It returns nil once MySQL answered, ctx's
// error (with the last reason) if the process was told to stop first, and
// at once an error MySQL gives for the credentials or the host's grants.
func waitForMySQL(ctx context.Context, db *sql.DB, dsn string, migrate bool, logger zerolog.Logger, report func(string)) error {
	began := time.Now()
	delay := firstPingRetry
	var logged time.Time
	for tries := 1; ; tries++ {
		err := pingOnce(ctx, db, dsn, migrate, logger)
		if err == nil {
			if tries > 1 {
				logger.Info().Int("tries", tries).Str("waited", time.Since(began).Round(time.Millisecond).String()).Msg("MySQL answers: starting")
			}
			return nil
		}
		if notMendedByWaiting(err) {
			return err
		}
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			// a server that took the connection and said nothing
			err = fmt.Errorf("no answer within %v", pingTimeout)
		}
		why := "MySQL does not answer yet (" + config.RedactError(err, dsn).Error() + ")"
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == errUnknownDatabase {
			why = "the database in -mysql-dsn does not exist yet; waiting for it to be created and migrated (bin/migrate, or -migrate)"
		}
		report(why)
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while waiting: %s: %w", why, ctx.Err())
		}
		if logged.IsZero() || time.Since(logged) >= waitLogEvery {
			logger.Warn().Err(config.RedactError(err, dsn)).Int("tries", tries).Str("waited", time.Since(began).Round(time.Millisecond).String()).
				Msg("waiting for MySQL before starting; /healthz answers 200 and /readyz 503 meanwhile")
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("stopped while waiting: %s: %w", why, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, maxPingRetry)
	}
}

// pingOnce is one ping, within pingTimeout, making the database first when
// MySQL says it is unknown and migrate is set.
func pingOnce(ctx context.Context, db *sql.DB, dsn string, migrate bool, logger zerolog.Logger) error {
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	err := db.PingContext(pctx)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == errUnknownDatabase && migrate {
		// a fresh server: make the database, then migrate it
		if err = stepmysql.EnsureDatabase(pctx, dsn); err == nil {
			logger.Info().Msg("created the database named in -mysql-dsn")
			err = db.PingContext(pctx)
		}
	}
	return err
}

// notMendedByWaiting reports the errors MySQL gives for a configuration
// only a person can change: the user or password (1045), the user's grants
// on the database (1044) or from this host (1130), an authentication
// method the driver does not speak (1251, 1698).
func notMendedByWaiting(err error) bool {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return false
	}
	switch me.Number {
	case 1044, 1045, 1130, 1251, 1698:
		return true
	}
	return false
}
