// Derived from NanoHUB v0.2.0's cmd/nanohub/nanohub.go and httpsubsys.go:
//
// Copyright 2025 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanohub, LICENSE).

// Package nanohubapp is cmd/nanohub: NanoHUB v0.2.0's server, with its
// flags, routes and auth, built on NanoHUB's own nanohub package, with
// -storage mysql running NanoCMD's engine on stepcollect's storage and
// every workflow's subsystem in MySQL.
package nanohubapp

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/alexedwards/flow"
	"github.com/jessepeterson/kmfddm/ddm"
	ddmapi "github.com/jessepeterson/kmfddm/http/api"
	ddmhttp "github.com/jessepeterson/kmfddm/http/ddm"
	cmdenghttp "github.com/micromdm/nanocmd/engine/http"
	cmdplanhttp "github.com/micromdm/nanocmd/subsystem/cmdplan/http"
	fvenablehttp "github.com/micromdm/nanocmd/subsystem/filevault/http"
	invhttp "github.com/micromdm/nanocmd/subsystem/inventory/http"
	profhttp "github.com/micromdm/nanocmd/subsystem/profile/http"
	"github.com/micromdm/nanohub/nanohub"
	nanolibhttp "github.com/micromdm/nanolib/http"
	"github.com/micromdm/nanolib/http/trace"
	"github.com/micromdm/nanolib/log"
	nanoapi "github.com/micromdm/nanomdm/http/api"
	"github.com/micromdm/nanomdm/http/authproxy"
	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/push/nanopush"
	pushservice "github.com/micromdm/nanomdm/push/service"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/metrics"
)

// Server is one cmd/nanohub process.
type Server struct {
	cfg      *Config
	logger   log.Logger
	zl       zerolog.Logger
	stores   *stores
	hub      *nanohub.NanoHUB
	handler  http.Handler
	listener net.Listener
}

// New builds the server as NanoHUB's main does, and listens on cfg.Listen.
// logger is NanoHUB's (its packages log through it); zl is stepcollect's
// storage's.
func New(ctx context.Context, cfg *Config, logger log.Logger, zl zerolog.Logger) (_ *Server, err error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		metrics.NewBuildInfo(version.Get()))
	st, err := openStores(ctx, cfg, logger, zl, reg)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, logger: logger, zl: zl, stores: st}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	roots, ints, err := getCerts(cfg.CAPath, cfg.IntPath)
	if err != nil {
		return nil, err
	}
	pushService := pushservice.New(st.mdm, st.mdm, nanopush.NewFactory(), logger.With("service", "push"))
	pusher := bestEffortPusher{Pusher: pushService, metrics: metrics.NewMDM(reg), logger: logger.With("service", "push")}
	if s.hub, err = nanohub.New(st.mdm, hubOptions(cfg, logger, st, pusher, roots, ints)...); err != nil {
		return nil, err
	}

	mux := http.NewServeMux()
	mux.Handle("/version", nanolibhttp.NewJSONVersionHandler(version.Get().Version))
	mux.Handle("/mdm", s.hub.ServerHandler())
	if cfg.AuthProxyURL != "" {
		ap, err := s.hub.NewAuthProxy(cfg.AuthProxyURL, "X-Enrollment-ID", authproxy.WithHeaderFunc("X-Trace-ID", trace.GetTraceID))
		if err != nil {
			return nil, fmt.Errorf("-auth-proxy-url: %w", err)
		}
		mux.Handle("/authproxy/", ap)
	}
	if h := s.hub.CheckInHandler(); h != nil {
		mux.Handle("/checkin", h)
	}
	if cfg.APIKey != "" {
		s.handleAPIs(mux, cfg.APIKey, pushService)
	}

	ops := http.NewServeMux()
	m := metrics.NewHTTP(reg)
	ops.Handle("GET /healthz", m.InstrumentHandler("healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok\n")) })))
	ops.Handle("GET /readyz", m.InstrumentHandler("readyz", httpapi.ReadyHandler(st.ready)))
	ops.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	traced := trace.NewTraceLoggingHandler(mux, logger.With("handler", "log"), newTraceID)
	// probes are served without NanoHUB's request log line: one every few
	// seconds would fill the log
	s.handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h, pattern := ops.Handler(r); pattern != "" {
			h.ServeHTTP(w, r)
			return
		}
		traced.ServeHTTP(w, r)
	})

	if s.listener, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("-listen %s: %w", cfg.Listen, err)
	}
	return s, nil
}

// hubOptions are NanoHUB's main's options for cfg.
func hubOptions(cfg *Config, logger log.Logger, st *stores, pusher bestEffortPusher, roots, ints []byte) []nanohub.Option {
	opts := []nanohub.Option{
		nanohub.WithLogger(logger),
		nanohub.WithRootPEMs(roots),
		nanohub.WithIntermediatePEMs(ints),
		nanohub.WithAPNSPush(pusher),
		nanohub.WithUADefault(cfg.UAZLChallenge),
		nanohub.WithDM(st.dm),
		nanohub.WithDMStatusStore(st.dm, getStatusID),
		nanohub.WithWF(st.cmd),
		nanohub.WithWFEvents(st.cmd),
	}
	if cfg.Retro {
		opts = append(opts, nanohub.WithAllowRetroactive())
	}
	if cfg.Checkin {
		opts = append(opts, nanohub.WithCheckinHandler(), nanohub.WithoutServerCombinedHandler())
	}
	if cfg.DMShard {
		opts = append(opts, nanohub.WithDMShard(nil))
	}
	opts = append(opts, workflows(logger, st)...)
	if cfg.CertHeader != "" {
		opts = append(opts, nanohub.WithCertHeader(cfg.CertHeader))
	} else {
		// default to Mdm-Signature
		opts = append(opts, nanohub.WithMdmSignature())
	}
	if cfg.Debug {
		opts = append(opts, nanohub.WithMdmSignatureErrorLog())
	}
	if cfg.Dump {
		opts = append(opts, nanohub.WithDumpToStdout())
	}
	if cfg.WebhookURL != "" {
		opts = append(opts, nanohub.WithWebhook(cfg.WebhookURL))
	}
	if cfg.Migration {
		opts = append(opts, nanohub.WithMigration())
	}
	if cfg.WorkerInterval > 0 {
		opts = append(opts, nanohub.WithWFWorker(st.cmd), nanohub.WithWFWorkerDuration(time.Second*time.Duration(cfg.WorkerInterval)))
		if cfg.RePushInterval > 0 {
			opts = append(opts, nanohub.WithWFWorkerRePushDuration(time.Second*time.Duration(cfg.RePushInterval)))
		}
	}
	return opts
}

// handleAPIs serves NanoMDM's, NanoCMD's and KMFDDM's APIs under key, at
// NanoHUB's prefixes.
func (s *Server) handleAPIs(mux *http.ServeMux, key string, pushService *pushservice.PushService) {
	logger, st := s.logger, s.stores
	authMW := func(h http.Handler) http.Handler {
		return nanolibhttp.NewSimpleBasicAuthHandler(h, "nanohub", key, "NanoHUB API")
	}

	nanoMux := nanolibhttp.NewMWMux(http.NewServeMux())
	nanoMux.Use(authMW)
	nanoapi.HandleAPIv1("", nanoMux, logger, st.mdm, pushService)
	mux.Handle("/api/v1/nanomdm/", http.StripPrefix("/api/v1/nanomdm", nanoMux))

	cmdMux := flow.New()
	cmdMux.Use(authMW)
	cmdenghttp.HandleAPIv1("", cmdMux, logger, s.hub.Engine(), st.cmd)
	invhttp.HandleAPIv1("", cmdMux, logger, st.inventory)
	profhttp.HandleAPIv1("", cmdMux, logger, st.profile)
	fvenablehttp.HandleAPIv1("", cmdMux)
	cmdplanhttp.HandleAPIv1("", cmdMux, logger, st.cmdplan)
	mux.Handle("/api/v1/nanocmd/", http.StripPrefix("/api/v1/nanocmd", cmdMux))

	ddmMux := flow.New()
	ddmMux.Use(authMW)
	ddmapi.HandleAPIv1("", ddmMux, logger, st.dm, s.hub.DMNotifier())
	ddmMux.Handle("/declaration-items", ddmhttp.TokensOrDeclarationItemsHandler(st.dm, false, logger.With("handler", "declaration-items")), "GET")
	ddmMux.Handle("/tokens", ddmhttp.TokensOrDeclarationItemsHandler(st.dm, true, logger.With("handler", "tokens")), "GET")
	ddmMux.Handle("/declaration/:type/:id",
		http.StripPrefix("/declaration/", ddmhttp.DeclarationHandler(st.dm, logger.With("handler", "declaration"))), "GET")
	mux.Handle("/api/v1/ddm/", http.StripPrefix("/api/v1/ddm", ddmMux))

	if h := s.hub.MigrationHandler(); h != nil {
		mux.Handle("/migration", authMW(h))
	}
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Run serves until ctx ends, with the engine worker and, with -storage
// mysql, the sweep and the receipts' pruning beside it.
func (s *Server) Run(ctx context.Context) error {
	defer s.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.cfg.WorkerInterval > 0 {
		s.hub.GoStartEngineRunner(ctx)
	}
	if s.stores.sweeper != nil && s.cfg.SweepInterval > 0 {
		go every(ctx, time.Duration(s.cfg.SweepInterval)*time.Second, s.sweep)
	}
	if s.stores.steps != nil {
		go every(ctx, time.Minute, s.pruneReceipts)
	}

	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
	shutDown := make(chan struct{})
	go func() {
		defer close(shutDown)
		<-ctx.Done()
		shut, done := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer done()
		srv.Shutdown(shut)
	}()
	s.logger.Info("msg", "starting server", "listen", s.Addr())
	err := srv.Serve(s.listener)
	if errors.Is(err, http.ErrServerClosed) {
		<-shutDown
		err = nil
	}
	if err != nil {
		s.logger.Info("msg", "server stopped", "err", err)
	}
	return err
}

func (s *Server) sweep(ctx context.Context) {
	res, err := s.stores.sweeper.SweepCounted(ctx, metrics.SweepPeriodic)
	ev := s.zl.Debug()
	if err != nil && ctx.Err() == nil {
		ev = s.zl.Warn().Err(err)
	} else if res.Collected > 0 {
		ev = s.zl.Info()
	}
	ev.Str("component", "sweeper").Int("examined", res.Examined).Int("collected", res.Collected).Msg("sweep")
}

// receiptAge is how long a completion's receipt is kept: it is asked for
// only by the retry of its own transaction, within seconds.
const receiptAge = 10 * time.Minute

func (s *Server) pruneReceipts(ctx context.Context) {
	n, err := s.stores.steps.PruneReceipts(ctx, receiptAge)
	if err != nil && ctx.Err() == nil {
		s.zl.Warn().Err(err).Str("component", "receipts").Msg("pruning completion receipts")
	} else if n > 0 {
		s.zl.Debug().Str("component", "receipts").Int64("pruned", n).Msg("pruned completion receipts")
	}
}

// every calls fn each interval until ctx ends.
func every(ctx context.Context, interval time.Duration, fn func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn(ctx)
	}
}

func (s *Server) close() {
	if s.listener != nil {
		s.listener.Close()
	}
	if s.stores != nil && s.stores.close != nil {
		s.stores.close()
	}
}

func getCerts(rootsPath, intsPath string) (rootBytes []byte, intBytes []byte, err error) {
	if rootsPath == "" {
		return nil, nil, errors.New("no path to CA root")
	}
	if rootBytes, err = os.ReadFile(rootsPath); err != nil {
		return nil, nil, err
	}
	if intsPath != "" {
		intBytes, err = os.ReadFile(intsPath)
	}
	return rootBytes, intBytes, err
}

// newTraceID generates a new HTTP trace ID for context logging, as NanoHUB's.
func newTraceID(_ *http.Request) string { return fmt.Sprintf("%016x", rand.Uint64()) }

func getStatusID(r *mdm.Request, _ *ddm.StatusReport) (string, error) {
	return trace.GetTraceID(r.Context()), nil
}
