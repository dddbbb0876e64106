// Derived from NanoCMD v0.7.1's cmd/nanocmd/main.go:
//
// Copyright 2023 Jesse Peterson
// Licensed under the MIT License (github.com/micromdm/nanocmd, LICENSE).

// Package nanocmdapp is cmd/nanocmd: NanoCMD v0.7.1's server, with its
// flags, routes, auth and workflows, wired as its own main wires them, and
// with -storage mysql on stepcollect's storage for the engine and MySQL
// storages for every subsystem.
package nanocmdapp

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/alexedwards/flow"
	"github.com/micromdm/nanocmd/engine"
	enginehttp "github.com/micromdm/nanocmd/engine/http"
	httpcmd "github.com/micromdm/nanocmd/http"
	"github.com/micromdm/nanocmd/http/api"
	"github.com/micromdm/nanocmd/logkeys"
	"github.com/micromdm/nanocmd/mdm/foss"
	cmdplanhttp "github.com/micromdm/nanocmd/subsystem/cmdplan/http"
	fvenablehttp "github.com/micromdm/nanocmd/subsystem/filevault/http"
	invhttp "github.com/micromdm/nanocmd/subsystem/inventory/http"
	profhttp "github.com/micromdm/nanocmd/subsystem/profile/http"
	"github.com/micromdm/nanocmd/utils/uuid"
	nanohttp "github.com/micromdm/nanolib/http"
	"github.com/micromdm/nanolib/http/trace"
	"github.com/micromdm/nanolib/log"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/bodyadmit"
	"github.com/stepcollect/stepcollect/internal/version"
	"github.com/stepcollect/stepcollect/metrics"
)

const (
	apiUsername = "nanocmd"
	apiRealm    = "nanocmd"

	// maxBody bounds a webhook's or a keyed route's body (stepcollect's
	// api default; MDM results can be large).
	maxBody = 32 << 20
	// bodyBudget is the working memory of the bodies read and decoded at
	// once, webhooks' and keyed routes' alike (the api's default
	// -max-inflight-body-bytes).
	bodyBudget = 256 << 20
	// readTimeout bounds the arrival of a request, headers and body, as
	// the api's request timeout does: a client that sends headers and then
	// nothing, or trickles, holds a connection no longer than this. It ends
	// with the body: net/http clears it once the body is read, so a handler
	// may run longer without its request being cancelled. It is also the
	// longest a webhook body waits for its share of the budget.
	readTimeout = 2 * time.Minute
	// idleTimeout closes a kept-alive connection with no request on it.
	idleTimeout = 2 * time.Minute
)

// Server is one cmd/nanocmd process.
type Server struct {
	cfg      *Config
	logger   log.Logger
	zl       zerolog.Logger
	storage  *storageConfig
	worker   *engine.Worker
	handler  http.Handler
	listener net.Listener
}

// New builds the server as NanoCMD's main does, and listens on cfg.Listen.
// logger is NanoCMD's (its packages log through it); zl is stepcollect's
// storage's.
func New(ctx context.Context, cfg *Config, logger log.Logger, zl zerolog.Logger) (_ *Server, err error) {
	if cfg.EnqueueURL == "" || cfg.EnqueueAPI == "" || cfg.PushURL == "" {
		return nil, errors.New("enqueue URL, push URL, and API required")
	}
	reg := newRegistry()
	storage, err := parseStorage(ctx, cfg, zl, reg)
	if err != nil {
		return nil, fmt.Errorf("parse storage: %w", err)
	}
	s := &Server{cfg: cfg, logger: logger, zl: zl, storage: storage}
	defer func() {
		if err != nil {
			s.close()
		}
	}()

	// configure our "MDM" i.e. how we send commands and receive responses
	maxURL := cfg.MaxURLBytes
	if maxURL == 0 {
		maxURL = DefaultMaxURLBytes
	}
	mdmMetrics := metrics.NewMDM(reg)
	mdm, err := newMDMAPI(cfg.EnqueueURL, cfg.PushURL, cfg.EnqueueAPI, cfg.MicroMDM, maxURL, mdmMetrics, logger.With("service", "mdm"))
	if err != nil {
		return nil, fmt.Errorf("creating enqueuer: %w", err)
	}

	// configure the workflow engine
	eOpts := []engine.Option{engine.WithLogger(logger.With("service", "engine"))}
	if cfg.StepTimeout > 0 {
		eOpts = append(eOpts, engine.WithDefaultTimeout(time.Second*time.Duration(cfg.StepTimeout)))
	}
	if storage.event != nil {
		eOpts = append(eOpts, engine.WithEventStorage(storage.event))
	}
	e := engine.New(markingStorage{storage.engine}, mdm, eOpts...)

	// the engine worker: timeouts, re-pushes and NotUntil, as in NanoCMD
	// (stepcollect's scheduler leaves this database's steps to it)
	if cfg.WorkerInterval > 0 {
		wOpts := []engine.WorkerOption{
			engine.WithWorkerLogger(logger.With("service", "engine worker")),
			engine.WithWorkerDuration(time.Second * time.Duration(cfg.WorkerInterval)),
		}
		if cfg.RePushInterval > 0 {
			wOpts = append(wOpts, engine.WithWorkerRePushDuration(time.Second*time.Duration(cfg.RePushInterval)))
		}
		s.worker = engine.NewWorker(e, storage.engine, mdm, wOpts...)
	}

	// the workflows and the API find a missing profile or cmdplan through
	// these, noted as a 404 naming it (apierrors.go)
	storage.profile, storage.cmdplan = notedProfiles{storage.profile}, notedCMDPlans{storage.cmdplan}

	// the workflows enqueue through the splitter, the engine behind it
	steps := &splitSteps{engine: e, api: mdm, cancel: storage.engine.CancelSteps, wholeStep: storage.steps == nil, ider: uuid.NewUUID(), logger: logger.With("service", "engine")}
	if err = registerWorkflows(logger, e, storage, steps); err != nil {
		return nil, fmt.Errorf("registering workflows: %w", err)
	}

	m := metrics.NewHTTP(reg)
	mux := flow.New()
	mux.Handle("/version", m.InstrumentHandler("version", nanohttp.NewJSONVersionHandler(version.Get().Version)))
	handleOps(mux, m, reg, storage.ready)

	var eventHandler foss.MDMEventReceiver = storedAnswers{MDMEventReceiver: e, metrics: mdmMetrics, logger: logger.With("service", "engine")}
	if cfg.DumpWebhook {
		eventHandler = foss.NewMDMEventDumper(eventHandler, os.Stdout)
	}
	var h http.Handler = foss.WebhookHandler(eventHandler, logger.With("handler", "webhook"))
	if cfg.DumpWebhook {
		h = httpcmd.DumpHandler(h, os.Stdout)
	}
	bodies := bodyadmit.New(bodyadmit.Config{MaxBody: maxBody, Budget: bodyBudget, Timeout: readTimeout})
	h = webhookBody(h, []byte(cfg.WebhookHMACKey), bodies, logger.With("handler", "webhook"))
	mux.Handle("/webhook", m.InstrumentHandler("webhook", h))

	if cfg.APIKey != "" {
		handleAPI(mux, m, cfg.APIKey, logger, checkedStarter{e: e, fold: cfg.Storage == "mysql"}, storage, bodies)
	}
	s.handler = untraced(mux, trace.NewTraceLoggingHandler(mux, logger.With("handler", "log"), newTraceID))

	if s.listener, err = net.Listen("tcp", cfg.Listen); err != nil {
		return nil, fmt.Errorf("-listen %s: %w", cfg.Listen, err)
	}
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() string { return s.listener.Addr().String() }

// Run serves until ctx ends, with the engine worker and, with -storage
// mysql, the sweep beside it (or, with -redis-url, the hand-off to the
// worker's queue).
func (s *Server) Run(ctx context.Context) error {
	defer s.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if s.worker != nil {
		go func() {
			err := s.worker.Run(ctx)
			logs := []interface{}{logkeys.Message, "engine worker stopped"}
			if err != nil && ctx.Err() == nil {
				s.logger.Info(append(logs, logkeys.Error, err)...)
				return
			}
			s.logger.Debug(logs...)
		}()
	}
	if s.storage.sweeper != nil && s.cfg.SweepInterval > 0 {
		go every(ctx, time.Duration(s.cfg.SweepInterval)*time.Second, s.sweep)
	}
	if s.storage.steps != nil {
		go every(ctx, time.Minute, s.pruneReceipts)
	}

	if h := s.storage.handoff; h != nil {
		// its own context: it outlives the requests in flight at shutdown,
		// whose released steps it still hands over (its final flush)
		hctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		go h.Run(hctx)
		defer func() { stop(); <-h.Done() }()
	}

	srv := &http.Server{Handler: s.handler, ReadHeaderTimeout: 30 * time.Second, ReadTimeout: readTimeout, IdleTimeout: idleTimeout}
	shutDown := make(chan struct{})
	go func() {
		defer close(shutDown)
		<-ctx.Done()
		shut, done := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer done()
		srv.Shutdown(shut)
	}()
	s.logger.Info(logkeys.Message, "starting server", "listen", s.Addr())
	err := srv.Serve(s.listener)
	if errors.Is(err, http.ErrServerClosed) {
		// Serve returns at once; the requests in flight finish (and hand
		// over their released steps) before the storage is closed
		<-shutDown
	}
	logs := []interface{}{logkeys.Message, "server shutdown"}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	if err != nil {
		logs = append(logs, logkeys.Error, err)
	}
	s.logger.Info(logs...)
	return err
}

// sweep collects the steps whose inline collection did not happen (a crash
// between the commit and the collection, a claim that was skipped). Safe on
// any number of replicas: claims are SKIP LOCKED.
func (s *Server) sweep(ctx context.Context) {
	res, err := s.storage.sweeper.SweepCounted(ctx, metrics.SweepPeriodic)
	ev := s.zl.Debug()
	if err != nil && ctx.Err() == nil {
		ev = s.zl.Warn().Err(err)
	} else if res.Collected > 0 {
		ev = s.zl.Info()
	}
	ev.Str("component", "sweeper").Int("examined", res.Examined).Int("collected", res.Collected).Msg("sweep")
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

// receiptAge is how long a completion's receipt is kept: it is asked for
// only by the retry of its own transaction, within seconds.
const receiptAge = 10 * time.Minute

// pruneReceipts deletes old completion receipts, on every replica (the
// deletes are by age, a bounded batch at a time).
func (s *Server) pruneReceipts(ctx context.Context) {
	n, err := s.storage.steps.PruneReceipts(ctx, receiptAge)
	if err != nil && ctx.Err() == nil {
		s.zl.Warn().Err(err).Str("component", "receipts").Msg("pruning completion receipts")
	} else if n > 0 {
		s.zl.Debug().Str("component", "receipts").Int64("pruned", n).Msg("pruned completion receipts")
	}
}

func (s *Server) close() {
	if s.listener != nil {
		s.listener.Close()
	}
	if s.storage != nil && s.storage.close != nil {
		s.storage.close()
	}
}

// handleAPI serves NanoCMD's API behind key, each subsystem's routes
// counted under its name, a client's mistake answered with its status
// (apierrors.go).
func handleAPI(mux *flow.Mux, m *metrics.HTTP, key string, logger log.Logger, e enginehttp.APIEngine, st *storageConfig, bodies *bodyadmit.Admitter) {
	auth := func(h http.Handler) http.Handler {
		return nanohttp.NewSimpleBasicAuthHandler(h, apiUsername, key, apiRealm)
	}
	group := func(name string, routes func(mux *flow.Mux)) {
		mux.Group(func(mux *flow.Mux) {
			// counted outside the key, so that refused requests show too
			mux.Use(func(h http.Handler) http.Handler { return m.InstrumentHandler(name, h) }, refuseCrossSite, auth, apiBody(bodies), noteStatus, checkJSONBody)
			routes(mux)
		})
	}
	group("engine", func(mux *flow.Mux) { enginehttp.HandleAPIv1("/v1", mux, logger, e, notedEvents{st.event}) })
	group("inventory", func(mux *flow.Mux) {
		// v0.7.1 serves the inventory at /inventory (its handler
		// ignores the prefix); its docs say /v1/inventory: both
		invhttp.HandleAPIv1("/v1", mux, logger, st.inventory)
		mux.Handle("/v1/inventory", invhttp.RetrieveInventory(st.inventory, logger.With("handler", "get-inventory")), "GET")
	})
	group("profile", func(mux *flow.Mux) { profhttp.HandleAPIv1("/v1", mux, logger, st.profile) })
	group("fvenable", func(mux *flow.Mux) { fvenablehttp.HandleAPIv1("/v1", mux) })
	group("cmdplan", func(mux *flow.Mux) { cmdplanhttp.HandleAPIv1("/v1", mux, logger, st.cmdplan) })
}

// crossSite refuses a browser's unsafe request sent from another site, as
// the api's /v1 does: a forged form POST would carry the Basic credentials
// the browser cached. Clients that are not browsers send neither
// Sec-Fetch-Site nor Origin, and pass.
var crossSite = http.NewCrossOriginProtection()

func refuseCrossSite(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := crossSite.Check(r); err != nil {
			api.JSONError(w, fmt.Errorf("refused: %w (NanoCMD's API takes no request a browser sends from another site)", err), http.StatusForbidden)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// apiBody reads a keyed route's whole body under the webhooks' limit, pace
// and budget before NanoCMD's handler, which reads a body of any size
// (PUT /v1/profile/{name}) at any pace. Refused as webhookBody refuses,
// in NanoCMD's {"error": "..."} shape.
func apiBody(bodies *bodyadmit.Admitter) func(http.Handler) http.Handler {
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, release, err := bodies.Admit(w, r)
			if release != nil {
				defer release()
			}
			if err != nil {
				w.Header().Set("Connection", "close")
				status, msg := bodyRefusal(err)
				api.JSONError(w, errors.New(msg), status)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			next.ServeHTTP(w, r)
		})
	}
}

// bodyRefusal is the status and message of a body Admit refused.
func bodyRefusal(err error) (int, string) {
	var mbe *http.MaxBytesError
	var be *bodyadmit.Error
	switch {
	case errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", mbe.Limit)
	case errors.As(err, &be):
		return be.Status, be.Msg
	}
	return http.StatusBadRequest, "body: " + err.Error()
}

// webhookBody reads a webhook's whole body before NanoCMD's handler sees
// it, as the api reads its own (internal/bodyadmit): at most the limit, at
// a minimum pace once it is large, under the in-flight body budget. That
// handler decodes a body of any size, so requests could otherwise take all
// the memory, and the process with it every result in flight. A larger
// body is answered 413 naming the limit (unread when its Content-Length
// says so); one that arrives too slowly 408. With key, a body without
// NanoMDM's X-Hmac-Signature (standard base64 of HMAC-SHA256 over the body)
// is answered 401.
func webhookBody(next http.Handler, key []byte, bodies *bodyadmit.Admitter, logger log.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// a browser's forged POST, before its body is read (NanoMDM sends
		// neither Origin nor Sec-Fetch-Site)
		if err := httpapi.RefuseBrowserWebhook(r); err != nil {
			logger.Info(logkeys.Message, "webhook refused", logkeys.Error, err.Error())
			w.Header().Set("Connection", "close")
			http.Error(w, "webhook "+err.Error(), http.StatusForbidden)
			return
		}
		body, release, err := bodies.Admit(w, r)
		if release != nil {
			defer release()
		}
		if err != nil {
			// net/http would read what is left of the body before it
			// answers on a connection it keeps
			w.Header().Set("Connection", "close")
			status, msg := bodyRefusal(err)
			http.Error(w, "webhook "+msg, status)
			return
		}
		if len(key) > 0 {
			sig, err := base64.StdEncoding.DecodeString(r.Header.Get("X-Hmac-Signature"))
			mac := hmac.New(sha256.New, key)
			mac.Write(body)
			if err != nil || !hmac.Equal(sig, mac.Sum(nil)) {
				logger.Info(logkeys.Message, "webhook HMAC", logkeys.Error, "X-Hmac-Signature missing or wrong")
				http.Error(w, "X-Hmac-Signature: missing or wrong (-webhook-hmac-key)", http.StatusUnauthorized)
				return
			}
		}
		// NanoCMD's handler decodes every raw_payload with a decoder that
		// a small hostile plist stops the process with (a binary dict that
		// contains itself: a fatal stack overflow; an array claiming 2^34
		// elements: out of memory), losing every result in flight
		if err := httpapi.CheckWebhookPlists(body); err != nil {
			logger.Info(logkeys.Message, "webhook refused", logkeys.Error, err.Error())
			http.Error(w, "webhook "+err.Error(), http.StatusBadRequest)
			return
		}
		if err := checkWebhookEvent(body); errors.Is(err, errIgnoredTopic) {
			logger.Debug(logkeys.Message, "webhook ignored", logkeys.Error, err.Error())
			return
		} else if err != nil {
			logger.Info(logkeys.Message, "webhook refused", logkeys.Error, err.Error())
			http.Error(w, "webhook "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

// newTraceID generates a new HTTP trace ID for context logging, as NanoCMD's.
func newTraceID(_ *http.Request) string {
	return fmt.Sprintf("%016x", rand.Uint64())
}
