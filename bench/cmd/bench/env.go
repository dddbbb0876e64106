package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

// proc is a binary the service measurements run.
type proc struct {
	cmd     *exec.Cmd
	logs    bytes.Buffer
	stopped bool
}

func startProc(bin string, env []string, args ...string) (*proc, error) {
	p := &proc{cmd: exec.Command(bin, args...)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	return p, p.cmd.Start()
}

// stopGrace is how long stop waits for a process to exit after SIGINT
// before it kills it. A binary that does not stop (a profiling wrapper
// that does not pass the signal on, a shutdown that hangs) is reported and
// killed, not waited for in silence until someone notices the run stalled.
var stopGrace = time.Minute

// stop interrupts the process and waits for it, at most stopGrace before
// it kills it. With BENCH_LOG_DIR set, its output is kept there as
// <binary>-<pid>.log, for looking into a run.
func (p *proc) stop() {
	if p.cmd.Process != nil && !p.stopped {
		p.stopped = true
		// a killed wrapper's children can hold its output pipe open:
		// Wait then gives up on the pipe after this long
		p.cmd.WaitDelay = 5 * time.Second
		p.cmd.Process.Signal(os.Interrupt)
		kill := time.AfterFunc(stopGrace, func() {
			progress("%s (pid %d) did not exit within %s of SIGINT: killed", filepath.Base(p.cmd.Path), p.cmd.Process.Pid, stopGrace)
			p.cmd.Process.Kill()
		})
		p.cmd.Wait()
		kill.Stop()
		if dir := os.Getenv("BENCH_LOG_DIR"); dir != "" {
			name := fmt.Sprintf("%s-%d.log", filepath.Base(p.cmd.Path), p.cmd.Process.Pid)
			if err := os.WriteFile(filepath.Join(dir, name), p.logs.Bytes(), 0o644); err != nil {
				progress("keeping %s: %v", name, err)
			}
		}
	}
}

func awaitOK(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %v: %v", url, within, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// warmedClient is an HTTP client of at most inflight connections to one
// host, all opened beforehand (a few at a time) with GETs of warmURL.
func warmedClient(warmURL string, inflight int) *http.Client {
	c := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: inflight, MaxConnsPerHost: inflight}}
	for warmed := 0; warmed < inflight; warmed += 8 {
		var wg sync.WaitGroup
		for range min(8, inflight-warmed) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if resp, err := c.Get(warmURL); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
	}
	return c
}

const benchAPIKey = "bench-api-key"

// svcEnv is one service measurement's world: a fresh database, a private
// Redis, the callback receiver, the real cmd/api and any number of real
// cmd/worker processes, and an HTTP client with its connections open.
type svcEnv struct {
	timeline string // -timeline's file: the measured burst appends to it
	bin      string
	cfg      serverConfig
	dsn      string
	drop     func()
	env      []string // the database and Redis, for every process
	redis    *proc
	recv     *testkit.Receiver
	api      *proc
	apiURL   string
	workers  []*proc
	metrics  []string // each worker's base URL for /metrics
	client   *http.Client
	inflight int
	db       *sql.DB // the bench's own, to look at the tables
	probe    *sql.Conn
	// workerProfile is where the first worker writes its CPU profile
	// (none when empty).
	workerProfile string
}

// startEnv brings up the world for cfg: workers worker processes (none:
// start them later with startWorkers), the api (writing a CPU profile to
// profile when it is not empty) and inflight warmed client connections.
func (r *runner) startEnv(cfg serverConfig, workers, inflight int, profile string) (e *svcEnv, err error) {
	return r.startEnvWith(cfg, workers, inflight, envOptions{apiProfile: profile})
}

// envOptions are startEnvWith's extras: where the api and the first worker
// write their CPU profiles (none when empty), and environment variables
// every process gets after the bench's own (the last of a name wins).
type envOptions struct {
	apiProfile, workerProfile string
	env                       []string
}

// startEnvWith is startEnv with opts.
func (r *runner) startEnvWith(cfg serverConfig, workers, inflight int, opts envOptions) (e *svcEnv, err error) {
	profile := opts.apiProfile
	e = &svcEnv{bin: r.bin, cfg: cfg, inflight: inflight, workerProfile: opts.workerProfile}
	// every error return sets e to nil: what was started is env's
	env := e
	defer func() {
		if err != nil {
			env.close()
		}
	}()
	admin, server := r.serverOf(cfg)
	e.dsn, e.drop, err = freshDatabase(admin, server, merge(cfg.params, map[string]string{"interpolateParams": "true"}))
	if err != nil {
		return nil, err
	}
	if e.db, err = sql.Open("mysql", e.dsn); err != nil {
		return nil, err
	}
	e.db.SetMaxOpenConns(4)
	if e.probe, err = e.db.Conn(context.Background()); err != nil {
		return nil, err
	}
	redisPort, err := testkit.PickPort()
	if err != nil {
		return nil, err
	}
	e.redis, err = startProc("redis-server", nil, "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--loglevel", "warning")
	if err != nil {
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	e.env = append([]string{"STEPCOLLECT_MYSQL_DSN=" + e.dsn, fmt.Sprintf("STEPCOLLECT_REDIS_URL=redis://127.0.0.1:%d/0", redisPort),
		"STEPCOLLECT_LOG_LEVEL=warn"}, opts.env...)
	// the workflow engine's side, answering every event at once
	e.recv = testkit.StartReceiver(testkit.ReceiverOptions{})
	if workers > 0 {
		if _, err := e.startWorkers(workers); err != nil {
			return nil, err
		}
	}
	apiPort, err := testkit.PickPort()
	if err != nil {
		return nil, err
	}
	apiEnv := append(append([]string(nil), e.env...), "STEPCOLLECT_API_KEY="+benchAPIKey, "STEPCOLLECT_MYSQL_MAX_CONNS="+strconv.Itoa(cfg.Pool))
	if profile != "" {
		apiEnv = append(apiEnv, "STEPCOLLECT_CPU_PROFILE="+profile)
	}
	if e.api, err = startProc(filepath.Join(r.bin, "api"), apiEnv, "-listen", fmt.Sprintf("127.0.0.1:%d", apiPort)); err != nil {
		return nil, err
	}
	e.apiURL = fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	if err := awaitOK(e.apiURL+"/readyz", 30*time.Second); err != nil {
		return nil, fmt.Errorf("api: %v\n%s", err, e.api.logs.String())
	}

	// At most inflight requests in flight, on connections opened beforehand
	// a few at a time, as for the storage rows: NanoMDM's own concurrency is
	// bounded too, and ten thousand simultaneous connects would measure the
	// kernel's listen backlog, not the service.
	e.client = warmedClient(e.apiURL+"/healthz", inflight)
	return e, nil
}

// startWorkers starts k worker processes at once, the sweeper off and
// events POSTed to the receiver, and returns when every one answers
// /readyz (the database is migrated already: they skip it).
func (e *svcEnv) startWorkers(k int) (time.Time, error) {
	var started []*proc
	for range k {
		port, err := testkit.PickPort()
		if err != nil {
			return time.Time{}, err
		}
		env := e.env
		if e.workerProfile != "" && len(e.workers) == 0 {
			env = append(append([]string(nil), e.env...), "STEPCOLLECT_CPU_PROFILE="+e.workerProfile)
		}
		w, err := startProc(filepath.Join(e.bin, "worker"), env, "-metrics-listen", fmt.Sprintf("127.0.0.1:%d", port),
			"-migrate=false", "-sweep-interval", "0", "-callback-url", e.recv.URL)
		if err != nil {
			return time.Time{}, err
		}
		e.workers = append(e.workers, w)
		e.metrics = append(e.metrics, fmt.Sprintf("http://127.0.0.1:%d", port))
		started = append(started, w)
	}
	for i, w := range started {
		url := e.metrics[len(e.metrics)-len(started)+i]
		if err := awaitOK(url+"/readyz", 30*time.Second); err != nil {
			return time.Time{}, fmt.Errorf("worker: %v\n%s", err, w.logs.String())
		}
	}
	return time.Now(), nil
}

func (e *svcEnv) close() {
	if e.api != nil {
		e.api.stop()
	}
	var wg sync.WaitGroup
	for _, w := range e.workers {
		wg.Add(1)
		go func() { defer wg.Done(); w.stop() }()
	}
	wg.Wait()
	if e.recv != nil {
		e.recv.Close()
		if wrong := e.recv.Violations(); len(wrong) > 0 {
			progress("the receiver saw %d wrong deliveries, the first: %s", len(wrong), wrong[0])
		}
	}
	if e.redis != nil {
		e.redis.stop()
	}
	if e.probe != nil {
		e.probe.Close()
	}
	if e.db != nil {
		e.db.Close()
	}
	if e.drop != nil {
		e.drop()
	}
}

// The names of the processes a service row's CPU is reported by (the
// workers after the first are procWorker 2, 3 …).
const (
	procAPI    = "api"
	procWorker = "worker"
	procMySQLD = "mysqld"
	procBench  = "load generator" // the webhook client and the event receiver
)

// pids are the processes whose CPU time a measurement reports.
func (e *svcEnv) pids(serverPID int) map[string]int {
	pids := map[string]int{procAPI: e.api.cmd.Process.Pid, procBench: os.Getpid()}
	for i, w := range e.workers {
		name := procWorker
		if i > 0 {
			name = fmt.Sprintf("%s %d", procWorker, i+1)
		}
		pids[name] = w.cmd.Process.Pid
	}
	if serverPID > 0 {
		pids[procMySQLD] = serverPID
	}
	return pids
}

// enrollment and commandUUID name the benchmark's enrollment i and the
// command it answers: one shared command (one step to every enrollment),
// or one of its own (control: a step each).
func enrollment(i int) string { return fmt.Sprintf("SVC-%07d", i) }

func commandUUID(i int, control bool) string {
	if control {
		return fmt.Sprintf("SVC-UUID-%d", i)
	}
	return "SVC-UUID"
}

// createSteps stores, through POST /v1/steps, the steps of enrollments
// from to from+n-1: one step to all of them, or (control) a step each,
// conc requests at a time.
func (e *svcEnv) createSteps(from, n int, control bool, conc int) error {
	post := e.postStep
	if !control {
		ids := make([]string, n)
		for i := range ids {
			ids[i] = enrollment(from + i)
		}
		return post(ids, commandUUID(from, false))
	}
	sem := make(chan struct{}, conc)
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for i := from; i < from+n; i++ {
		sem <- struct{}{}
		mu.Lock()
		failed := first != nil
		mu.Unlock()
		if failed {
			<-sem
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := post([]string{enrollment(i)}, commandUUID(i, true)); err != nil {
				mu.Lock()
				first = err
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

// postStep enqueues a step of one command, uuid, to ids through the api.
func (e *svcEnv) postStep(ids []string, uuid string) error {
	body, _ := json.Marshal(map[string]any{"workflow_name": "io.stepcollect.bench", "instance_id": uuid, "ids": ids,
		"commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation"}}})
	req, _ := http.NewRequest("POST", e.apiURL+"/v1/steps", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+benchAPIKey)
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("enqueue: %s %s", resp.Status, b)
	}
	io.Copy(io.Discard, resp.Body)
	return nil
}

// The service row's warm-up (svcEnv.warmUp): a step of its own.
const warmCommandUUID = "SVC-WARM-UUID"

func warmEnrollment(i int) string { return fmt.Sprintf("SVC-WARM-%07d", i) }

// webhookBody is NanoMDM's webhook for enrollment i's answer.
func webhookBody(i int, control bool) []byte {
	return answerBody(enrollment(i), commandUUID(i, control), "bench-"+strconv.Itoa(i))
}

// answerBody is NanoMDM's webhook for enrollment id's answer to command
// uuid, under NanoMDM's event id eventID.
func answerBody(id, uuid, eventID string) []byte {
	raw := base64.StdEncoding.EncodeToString(fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>CommandUUID</key><string>%s</string><key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string></dict></plist>`, uuid, id))
	return fmt.Appendf(nil, `{"topic":"mdm.Connect","event_id":%q,"created_at":"2026-11-29T00:00:00Z","acknowledge_event":{"udid":%q,"status":"Acknowledged","command_uuid":%q,"raw_payload":%q}}`, eventID, id, uuid, raw)
}

// webhook posts one webhook body; the error class is empty on a 200.
func (e *svcEnv) webhook(body []byte) string {
	resp, err := e.client.Post(e.apiURL+"/webhook", "application/json", bytes.NewReader(body))
	if err != nil {
		return "http: no answer"
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "http " + strconv.Itoa(resp.StatusCode)
	}
	return ""
}

// stepsEmpty reports whether the steps table holds no row: one index dive
// on the bench's own connection, cheap enough to ask every 10 ms.
func (e *svcEnv) stepsEmpty() (bool, error) {
	var exists int
	err := e.probe.QueryRowContext(context.Background(), `SELECT EXISTS (SELECT 1 FROM steps)`).Scan(&exists)
	return exists == 0, err
}

// awaitStepsEmpty polls stepsEmpty every 10 ms and returns when the table
// was first seen empty; ok is false if it was not within limit.
func (e *svcEnv) awaitStepsEmpty(limit time.Duration) (at time.Time, ok bool) {
	deadline := time.Now().Add(limit)
	for {
		empty, err := e.stepsEmpty()
		at = time.Now()
		if err == nil && empty {
			return at, true
		}
		if at.After(deadline) {
			return at, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// outboxPending counts the events not yet acknowledged.
func (e *svcEnv) outboxPending() int {
	var n int
	if err := e.probe.QueryRowContext(context.Background(), `SELECT COUNT(*) FROM stepcollect_outbox`).Scan(&n); err != nil {
		return -1 // never "none pending": a broken look must not read as drained
	}
	return n
}

// leftovers waits up to 10 s for the outbox to drain (acknowledging
// follows the POSTs) and returns what it still holds and what the step
// tables hold. An error reading either is returned, never a zero.
func (e *svcEnv) leftovers() (outbox int, st fanout.Stranded, err error) {
	for deadline := time.Now().Add(10 * time.Second); e.outboxPending() != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	if outbox = e.outboxPending(); outbox < 0 {
		return 0, st, fmt.Errorf("counting the outbox failed")
	}
	err = e.db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands)`).
		Scan(&st.Steps, &st.IDCommands, &st.StepCommands)
	if err != nil {
		return 0, st, fmt.Errorf("counting what the run left: %w", err)
	}
	return outbox, st, nil
}
