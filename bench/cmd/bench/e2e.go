package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// The end-to-end section: NanoCMD v0.7.1's own server (cmd/nanocmd, its
// MySQL storage, a fake NanoMDM in the bench process) and stepcollect's api
// and worker, each given the inventory workflow's step (DeviceInformation
// and SecurityInfo) to the same N enrollments and then every result
// through NanoMDM v0.9.0's own webhook sender, on the same private
// mariadbd, one after the other.

const (
	e2eWorkflow    = "io.micromdm.wf.inventory.v1" // NanoCMD's inventory workflow
	e2eNanoCMD     = "NanoCMD v0.7.1"
	e2eStepcollect = "stepcollect"
	e2eBinary      = "nanocmd"            // in -bin, built by the Makefile's bench-build
	e2eSchema      = "nanocmd-schema.sql" // likewise: NanoCMD's MySQL schema, from its module
	e2eMDMKey      = "bench-nanomdm-key"
	e2eAPIKey      = "bench-nanocmd-key"
	e2eWait        = 2 * time.Minute // for every enrollment done, at most
)

// e2eResult is the section's measurement: both implementations, same run.
type e2eResult struct {
	Mode     string    `json:"mode"` // "e2e"
	Server   string    `json:"server"`
	N        int       `json:"n"`
	Inflight int       `json:"inflight"`
	Shared   bool      `json:"shared_server,omitempty"` // -server: the counters are not this run's alone
	Runs     []*e2eRun `json:"runs"`                    // NanoCMD, then stepcollect
}

// e2eRun is one implementation's run.
type e2eRun struct {
	Impl     string         `json:"impl"`
	Webhooks int            `json:"webhooks"` // sent
	OK       int            `json:"ok"`       // answered 200
	Errors   map[string]int `json:"errors"`
	// From the release of the first webhook: to every enrollment done (0:
	// not within the wait), to the last webhook answered, and to the end of
	// the window the CPU times and statement counts are taken over.
	DoneMS       float64 `json:"done_ms"`
	LastAnswerMS float64 `json:"last_answer_ms"`
	WindowMS     float64 `json:"window_ms"`
	Done         int     `json:"enrollments_done"`
	P50MS        float64 `json:"webhook_p50_ms"`
	P99MS        float64 `json:"webhook_p99_ms"`
	// CPU time of each process over the window, in ms; Service names the
	// processes that are the implementation (mariadbd is counted beside
	// them; the bench process is neither).
	CPU     map[string]float64 `json:"cpu_ms"`
	Service []string           `json:"service"`
	// Statements are the server's SHOW GLOBAL STATUS deltas over the
	// window (Com_*, Questions, Connections), the bench's own statements
	// (BenchStatements: the SHOW and the probes) taken out of Com_select
	// and Questions.
	Statements      map[string]float64 `json:"statements"`
	BenchStatements int                `json:"bench_statements"`
	Stranded        fanout.Stranded    `json:"stranded"`
	// How the step was started: NanoCMD's workflow start, stepcollect's
	// POST /v1/steps.
	Start string `json:"start"`
	// NanoCMD: what its NanoMDM saw. stepcollect: the receiver's events.
	MDM            *fakeMDMStats `json:"fake_nanomdm,omitempty"`
	EventsReceived int           `json:"events_received,omitempty"`
	EventsDistinct int           `json:"events_distinct,omitempty"`
	OutboxLeft     int           `json:"outbox_left,omitempty"`
	Profiles       []e2eProfile  `json:"profiles,omitempty"`
	ProfileNote    string        `json:"profile_note,omitempty"`
}

type e2eProfile struct {
	Process string `json:"process"`
	Path    string `json:"path"`
	Top     string `json:"top"`
}

// e2e runs the section: NanoCMD first, then stepcollect, at defaults.
func (r *runner) e2e(n, inflight int, outDir string) (*e2eResult, error) {
	res := &e2eResult{Mode: "e2e", Server: configs[0].Name, N: n, Inflight: inflight, Shared: r.serverPID == 0}
	nc, err := r.e2eNanoCMD(configs[0], n, inflight)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e2eNanoCMD, err)
	}
	res.Runs = append(res.Runs, nc)
	sc, err := r.e2eStepcollect(configs[0], n, inflight, outDir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", e2eStepcollect, err)
	}
	res.Runs = append(res.Runs, sc)
	return res, nil
}

func (r *runner) e2eAnnounce(impl string, n int) {
	r.step++
	progress("[%d/%d] %-28s %-8s N=%-5d end to end, the inventory workflow's 2 commands …", r.step, max(r.total, r.step), impl, configs[0].Name, n)
}

// e2eNanoCMD runs NanoCMD v0.7.1's own server on a fresh database with its
// own schema, its NanoMDM the fake in the bench process; starts the
// inventory workflow for all n ids in one request, then answers every
// command enqueued through NanoMDM's webhook sender, inflight at a time.
// Every enrollment is done when id_commands holds no row: NanoCMD deletes
// an enrollment's rows in the request of the result that completes its
// step (and collects the step in the same request), so every enrollment
// is done once every webhook is answered, if they were all answered 200;
// the table is looked at after the last answer, and again every 10 ms if
// it still holds rows.
func (r *runner) e2eNanoCMD(cfg serverConfig, n, inflight int) (*e2eRun, error) {
	r.e2eAnnounce(e2eNanoCMD, n)
	schema, err := os.ReadFile(filepath.Join(r.bin, e2eSchema))
	if err != nil {
		return nil, fmt.Errorf("%v (make bench-build copies it from NanoCMD's module)", err)
	}
	dsn, drop, err := freshNanoCMDDatabase(r.admin, r.server, string(schema), cfg.params)
	if err != nil {
		return nil, err
	}
	defer drop()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	probe, err := db.Conn(context.Background())
	if err != nil {
		return nil, err
	}
	defer probe.Close()

	fake, err := startFakeMDM(e2eMDMKey)
	if err != nil {
		return nil, err
	}
	defer fake.close()
	port, _ := freePort()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	// every setting at its default but what it cannot run without
	nc, err := startProc(filepath.Join(r.bin, e2eBinary), nil, "-listen", fmt.Sprintf("127.0.0.1:%d", port),
		"-storage", "mysql", "-storage-dsn", dsn, "-api", e2eAPIKey,
		"-enqueue-url", fake.URL+"/v1/enqueue/", "-push-url", fake.URL+"/v1/push/", "-enqueue-api", e2eMDMKey)
	if err != nil {
		return nil, err
	}
	defer nc.stop()
	if err := awaitOK(base+"/version", 30*time.Second); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, nc.logs.String())
	}
	client := warmedClient(base+"/version", inflight)

	ids := make([]string, n)
	q := url.Values{}
	for i := range ids {
		ids[i] = e2eEnrollment(i)
		q.Add("id", ids[i])
	}
	req, _ := http.NewRequest("POST", base+"/v1/workflow/"+e2eWorkflow+"/start?"+q.Encode(), nil)
	req.SetBasicAuth("nanocmd", e2eAPIKey)
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("starting the workflow: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	start := fmt.Sprintf("`POST /v1/workflow/%s/start` with %d `id` parameters: %s", e2eWorkflow, n, resp.Status)
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusInternalServerError && bytes.Contains(body, []byte("recording workflow status")):
		// MariaDB has no INSERT … AS new: the wf_status upsert fails after
		// the step is stored and its commands enqueued
		start += fmt.Sprintf(" (expected on MariaDB, which has no `INSERT … AS new`: NanoCMD's `wf_status` upsert fails after the step "+
			"is stored and its commands enqueued; `%s`)", strings.TrimSpace(string(body)))
	default:
		return nil, fmt.Errorf("workflow start: %s %s\n%s", resp.Status, body, nc.logs.String())
	}
	order, cmds := fake.enrollments()
	st := fake.stats()
	if st.Enrollments != n || st.Commands != 2*n || st.Unattributed > 0 || st.BadBodies > 0 || st.Unauthorized > 0 {
		return nil, fmt.Errorf("the fake NanoMDM got commands for %d of %d enrollments, %d of %d commands (%+v)\n%s",
			st.Enrollments, n, st.Commands, 2*n, st, nc.logs.String())
	}
	var stepRows int
	db.QueryRow(`SELECT COUNT(*) FROM steps`).Scan(&stepRows)
	if stepRows != 1 {
		return nil, fmt.Errorf("%d steps stored, want 1", stepRows)
	}
	jobs := make([]e2eJob, len(order))
	for i, id := range order {
		jobs[i] = e2eJob{id: id, cmds: cmds[id]}
	}

	run := &e2eRun{Impl: e2eNanoCMD, Start: start, Service: []string{"nanocmd"},
		ProfileNote: "NanoCMD has no profiling flag or endpoint: no profile."}
	pids := map[string]int{"nanocmd": nc.cmd.Process.Pid, "bench": os.Getpid()}
	if r.serverPID > 0 {
		pids["mariadbd"] = r.serverPID
	}
	w, err := r.openWindow(pids)
	if err != nil {
		return nil, err
	}
	sent := sendResults(webhook.New(base+"/webhook", webhook.WithClient(client)), jobs, inflight, w.t0)
	run.fill(sent)

	// every enrollment done: id_commands empty, looked at after the last
	// answer (each look is a statement of the bench's, taken out below)
	probes := 0
	left := func() (int, error) {
		probes++
		var k int
		err := probe.QueryRowContext(context.Background(), `SELECT COUNT(DISTINCT enrollment_id) FROM id_commands`).Scan(&k)
		return k, err
	}
	doneAt, notDone := awaitZero(left, 10*time.Second, e2eWait)
	if notDone >= 0 {
		run.Done = n - notDone
	}
	if notDone == 0 {
		run.DoneMS = fanout.MS(later(doneAt, sent.last).Sub(w.t0))
	}
	if err := w.close(run, probes); err != nil {
		return nil, err
	}
	run.MDM = &st
	db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands)`).
		Scan(&run.Stranded.Steps, &run.Stranded.IDCommands, &run.Stranded.StepCommands)
	r.e2eDone(run)
	return run, nil
}

// e2eStepcollect runs stepcollect's api and one worker (at their defaults:
// log level info, the sweeper on) on the same work: one POST /v1/steps of
// the same two commands to the n enrollments, then the same results
// through the same sender, inflight at a time. Every enrollment is done
// when its step.completed event has arrived at the receiver. The CPU and
// statement window goes on until the outbox is empty (every event
// acknowledged) and the step collected, looked at every 10 ms.
func (r *runner) e2eStepcollect(cfg serverConfig, n, inflight int, outDir string) (*e2eRun, error) {
	r.e2eAnnounce(e2eStepcollect, n)
	apiProf, _ := filepath.Abs(filepath.Join(outDir, "e2e-api.cpu.pprof"))
	workerProf, _ := filepath.Abs(filepath.Join(outDir, "e2e-worker.cpu.pprof"))
	os.Remove(apiProf)
	os.Remove(workerProf)
	e, err := r.startEnvWith(cfg, 1, inflight, envOptions{apiProfile: apiProf, workerProfile: workerProf,
		env: []string{"STEPCOLLECT_LOG_LEVEL=info"}})
	if err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			e.close()
		}
	}()

	ids := make([]string, n)
	for i := range ids {
		ids[i] = e2eEnrollment(i)
	}
	cmds := []enqueuedCommand{{newUUID(), "DeviceInformation"}, {newUUID(), "SecurityInfo"}}
	var reqCmds []map[string]string
	for _, c := range cmds {
		reqCmds = append(reqCmds, map[string]string{"command_uuid": c.UUID, "request_type": c.RequestType,
			"command": base64.StdEncoding.EncodeToString(commandPlist(c))})
	}
	reqBody, _ := json.Marshal(map[string]any{"workflow_name": e2eWorkflow, "instance_id": newUUID(), "ids": ids, "commands": reqCmds})
	req, _ := http.NewRequest("POST", e.apiURL+"/v1/steps", bytes.NewReader(reqBody))
	req.Header.Set("Authorization", "Bearer "+benchAPIKey)
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return nil, fmt.Errorf("POST /v1/steps: %s %s", resp.Status, body)
	}
	jobs := make([]e2eJob, n)
	for i, id := range ids {
		jobs[i] = e2eJob{id: id, cmds: cmds}
	}

	run := &e2eRun{Impl: e2eStepcollect, Start: fmt.Sprintf("`POST /v1/steps` with %d ids and the 2 commands: %s", n, resp.Status),
		Service: []string{"api", "worker", "redis-server"}}
	pids := map[string]int{"api": e.api.cmd.Process.Pid, "worker": e.workers[0].cmd.Process.Pid,
		"redis-server": e.redis.cmd.Process.Pid, "bench": os.Getpid()}
	if r.serverPID > 0 {
		pids["mariadbd"] = r.serverPID
	}
	w, err := r.openWindow(pids)
	if err != nil {
		return nil, err
	}
	sent := sendResults(webhook.New(e.apiURL+"/webhook", webhook.WithClient(e.client)), jobs, inflight, w.t0)
	run.fill(sent)

	// every enrollment done: its step.completed at the receiver
	e.recv.await(n, 30*time.Second, e2eWait)
	received, distinct, last := e.recv.counts()
	run.EventsReceived, run.EventsDistinct, run.Done = received, distinct, min(distinct, n)
	if distinct >= n {
		run.DoneMS = fanout.MS(last.Sub(w.t0))
	}
	// the rest of the work the run caused: acknowledging the events,
	// collecting the step
	probes := 0
	pending := func() (int, error) {
		probes++
		var k int
		err := e.probe.QueryRowContext(context.Background(),
			`SELECT (SELECT COUNT(*) FROM stepcollect_outbox) + (SELECT COUNT(*) FROM steps)`).Scan(&k)
		return k, err
	}
	awaitZero(pending, 10*time.Second, 30*time.Second)
	if err := w.close(run, probes); err != nil {
		return nil, err
	}
	e.db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands), (SELECT COUNT(*) FROM stepcollect_outbox)`).
		Scan(&run.Stranded.Steps, &run.Stranded.IDCommands, &run.Stranded.StepCommands, &run.OutboxLeft)

	// the profiles are written when the processes stop
	e.close()
	closed = true
	for _, p := range []struct{ name, path string }{{"api", apiProf}, {"worker", workerProf}} {
		out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=10", filepath.Join(r.bin, p.name), p.path).CombinedOutput()
		if err != nil {
			run.ProfileNote += fmt.Sprintf("go tool pprof %s: %v: %s. ", p.path, err, strings.TrimSpace(string(out)))
			continue
		}
		run.Profiles = append(run.Profiles, e2eProfile{Process: p.name, Path: filepath.Base(p.path), Top: string(out)})
	}
	r.e2eDone(run)
	return run, nil
}

func (r *runner) e2eDone(run *e2eRun) {
	done := "not every enrollment done within the wait"
	if run.DoneMS > 0 {
		done = "every enrollment done in " + dur(run.DoneMS)
	}
	fmt.Fprintf(os.Stderr, " %s, %d/%d webhooks 200, p50 %s p99 %s, %.2f ms CPU a webhook (service + mariadbd)\n",
		done, run.OK, run.Webhooks, dur(run.P50MS), dur(run.P99MS), run.cpuPerWebhook(true, true))
}

// e2eEnrollment names the section's enrollment i.
func e2eEnrollment(i int) string { return fmt.Sprintf("E2E-%07d", i) }

func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := strings.ToUpper(hex.EncodeToString(b))
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// commandPlist is the command stepcollect is given with its step: the
// inventory workflow's, as NanoCMD enqueues it.
func commandPlist(c enqueuedCommand) []byte {
	queries := ""
	if c.RequestType == "DeviceInformation" {
		queries = "<key>Queries</key><array><string>Model</string><string>SerialNumber</string><string>Model</string><string>ModelName</string>" +
			"<string>DeviceName</string><string>BuildVersion</string><string>OSVersion</string><string>EthernetMAC</string>" +
			"<string>IsAppleSilicon</string><string>HasBattery</string><string>IsMultiUser</string><string>SupportsLOMDevice</string></array>"
	}
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict><key>Command</key><dict>%s<key>RequestType</key><string>%s</string></dict><key>CommandUUID</key><string>%s</string></dict></plist>
`, queries, c.RequestType, c.UUID)
}

// resultPlist is enrollment id's answer to c, as a Mac would give it: the
// queried values of DeviceInformation, or SecurityInfo's dictionary.
func resultPlist(id string, c enqueuedCommand) []byte {
	var payload string
	switch c.RequestType {
	case "DeviceInformation":
		payload = fmt.Sprintf(`<key>QueryResponses</key><dict><key>BuildVersion</key><string>23E224</string><key>DeviceName</key><string>Mac %[1]s</string>`+
			`<key>IsAppleSilicon</key><true/><key>Model</key><string>Mac14,2</string><key>ModelName</key><string>MacBook Air</string>`+
			`<key>OSVersion</key><string>14.4.1</string><key>SerialNumber</key><string>SN%[1]s</string></dict>`, id)
	case "SecurityInfo":
		payload = `<key>SecurityInfo</key><dict><key>AuthenticatedRootVolumeEnabled</key><true/><key>FDE_Enabled</key><false/>` +
			`<key>FirewallSettings</key><dict><key>BlockAllIncoming</key><false/><key>FirewallEnabled</key><false/><key>StealthMode</key><false/></dict>` +
			`<key>ManagementStatus</key><dict><key>EnrolledViaDEP</key><false/><key>IsUserEnrollment</key><false/><key>UserApprovedEnrollment</key><true/></dict>` +
			`<key>RemoteDesktopEnabled</key><false/><key>SecureBoot</key><dict><key>SecureBootLevel</key><string>full</string></dict>` +
			`<key>SystemIntegrityProtectionEnabled</key><true/></dict>`
	}
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict><key>CommandUUID</key><string>%s</string>%s<key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string></dict></plist>
`, c.UUID, payload, id)
}

// e2eJob is one enrollment's answers, sent one after another, in the order
// the commands were enqueued (a device answers its queue in order).
type e2eJob struct {
	id   string
	cmds []enqueuedCommand
}

type sendResult struct {
	lat    []time.Duration // of each webhook request
	ok     int
	errors map[string]int
	last   time.Time // the last answer
	t0     time.Time
}

// sendResults answers every job's commands through sender, inflight
// enrollments at a time (so at most inflight requests in flight), from t0
// on: the caller takes its snapshots just before.
func sendResults(sender *webhook.Webhook, jobs []e2eJob, inflight int, t0 time.Time) *sendResult {
	total := 0
	raws := make([][][]byte, len(jobs))
	for i, j := range jobs {
		for _, c := range j.cmds {
			raws[i] = append(raws[i], resultPlist(j.id, c))
		}
		total += len(j.cmds)
	}
	s := &sendResult{lat: make([]time.Duration, 0, total), errors: map[string]int{}, t0: t0}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(inflight, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				for k, c := range j.cmds {
					r := mdm.NewRequestWithContext(context.Background(), nil)
					r.EnrollID = &mdm.EnrollID{ID: j.id, Type: mdm.Device}
					t := time.Now()
					_, err := sender.CommandAndReportResults(r, &mdm.CommandResults{
						Enrollment: mdm.Enrollment{UDID: j.id}, CommandUUID: c.UUID, Status: "Acknowledged", Raw: raws[i][k]})
					at := time.Now()
					mu.Lock()
					s.lat = append(s.lat, at.Sub(t))
					if err != nil {
						s.errors[webhookErrClass(err)]++
					} else {
						s.ok++
					}
					if at.After(s.last) {
						s.last = at
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	return s
}

// webhookErrClass is "http <status>" for an answer other than 200, or
// "http: no answer".
func webhookErrClass(err error) string {
	const prefix = "unexpected HTTP status: "
	if msg := err.Error(); strings.HasPrefix(msg, prefix) {
		code, _, _ := strings.Cut(msg[len(prefix):], " ")
		return "http " + code
	}
	return "http: no answer"
}

func (run *e2eRun) fill(s *sendResult) {
	run.Webhooks, run.OK, run.Errors = len(s.lat), s.ok, s.errors
	run.P50MS, run.P99MS = fanout.Quantiles(s.lat)
	if !s.last.IsZero() {
		run.LastAnswerMS = fanout.MS(s.last.Sub(s.t0))
	}
}

// awaitZero calls count until it returns 0, and returns when it first did;
// left is the last count (0 when it got there, -1 when count never
// answered). It gives up after stall without the count changing, or after
// limit.
func awaitZero(count func() (int, error), stall, limit time.Duration) (at time.Time, left int) {
	start := time.Now()
	lastChange, prev := start, -1
	for {
		k, err := count()
		at = time.Now()
		if err == nil && k == 0 {
			return at, 0
		}
		if err == nil && k != prev {
			lastChange, prev = at, k
		}
		if at.Sub(lastChange) > stall || at.Sub(start) > limit {
			return at, prev
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// window is the span the CPU times and statement counts are taken over.
type window struct {
	r    *runner
	pids map[string]int
	cpu0 map[string]float64
	st0  map[string]float64
	t0   time.Time
}

// openWindow takes the first snapshot and starts the clock.
func (r *runner) openWindow(pids map[string]int) (*window, error) {
	st, err := r.globalStatus()
	if err != nil {
		return nil, err
	}
	w := &window{r: r, pids: pids, st0: st, cpu0: cpuTimes(pids)}
	w.t0 = time.Now()
	return w, nil
}

// close takes the second snapshot into run. probes are the statements the
// bench ran on the server meanwhile (the second SHOW is one more): each is
// one Com_select and one Questions.
func (w *window) close(run *e2eRun, probes int) error {
	cpu := cpuTimes(w.pids)
	run.WindowMS = fanout.MS(time.Since(w.t0))
	st, err := w.r.globalStatus()
	if err != nil {
		return err
	}
	run.CPU = map[string]float64{}
	for name := range w.pids {
		run.CPU[name] = cpu[name] - w.cpu0[name]
	}
	run.Statements = map[string]float64{}
	for k, v := range st {
		if d := v - w.st0[k]; d != 0 {
			run.Statements[k] = d
		}
	}
	run.BenchStatements = probes + 1
	run.Statements["Com_select"] -= float64(probes)
	run.Statements["Questions"] -= float64(probes + 1)
	return nil
}

// globalStatus is the server's statement counters: every Com_*, Questions
// and Connections.
func (r *runner) globalStatus() (map[string]float64, error) {
	rows, err := r.admin.Query(`SHOW GLOBAL STATUS WHERE Variable_name LIKE 'Com\_%' OR Variable_name IN ('Questions', 'Connections')`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]float64{}
	for rows.Next() {
		var name, value string
		if err := rows.Scan(&name, &value); err != nil {
			return nil, err
		}
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			out[name] = v
		}
	}
	return out, rows.Err()
}

// freshNanoCMDDatabase creates a database on server with NanoCMD's own
// schema, and returns its DSN with params, and a drop function.
func freshNanoCMDDatabase(admin *sql.DB, server, schema string, params map[string]string) (string, func(), error) {
	return newDatabase(admin, server, "bench_nanocmd_", params, true, func(db *sql.DB) error {
		if _, err := db.Exec(schema); err != nil {
			return fmt.Errorf("NanoCMD's schema: %w", err)
		}
		return nil
	})
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

// The figures the report shows.

// cpuMS is the CPU time, in ms, of the service's processes (service) and
// of mariadbd (db).
func (run *e2eRun) cpuMS(service, db bool) float64 {
	t := 0.0
	if service {
		for _, p := range run.Service {
			t += run.CPU[p]
		}
	}
	if db {
		t += run.CPU["mariadbd"]
	}
	return t
}

func (run *e2eRun) cpuPerWebhook(service, db bool) float64 {
	if run.Webhooks == 0 {
		return 0
	}
	return run.cpuMS(service, db) / float64(run.Webhooks)
}

// statementKinds are the rows of statements per result: a label and the
// status counters summed into it.
var statementKinds = []struct {
	label string
	vars  []string
}{
	{"SELECT", []string{"Com_select"}},
	{"INSERT", []string{"Com_insert", "Com_insert_select", "Com_replace", "Com_replace_select"}},
	{"UPDATE", []string{"Com_update", "Com_update_multi"}},
	{"DELETE", []string{"Com_delete", "Com_delete_multi"}},
	{"BEGIN", []string{"Com_begin"}},
	{"COMMIT", []string{"Com_commit"}},
	{"ROLLBACK", []string{"Com_rollback"}},
}

func (run *e2eRun) perResult(vars ...string) float64 {
	if run.Webhooks == 0 {
		return 0
	}
	t := 0.0
	for _, v := range vars {
		t += run.Statements[v]
	}
	return t / float64(run.Webhooks)
}

// otherStatements is Questions less the kinds above, per result: SET, a
// connection's COM_QUIT and the like.
func (run *e2eRun) otherStatements() float64 {
	o := run.perResult("Questions")
	for _, k := range statementKinds {
		o -= run.perResult(k.vars...)
	}
	return o
}

// markdown is the section.
func (e *e2eResult) markdown() string {
	if len(e.Runs) != 2 {
		return ""
	}
	nc, sc := e.Runs[0], e.Runs[1]
	var b strings.Builder
	fmt.Fprintf(&b, "## End to end against NanoCMD's own server\n\n"+
		"What a user running either gets, in one run on the same private mariadbd (the **%s** server setting): the same step, the "+
		"inventory workflow's two commands (DeviceInformation and SecurityInfo) to the same N=%d enrollments, then all %d results "+
		"through NanoMDM v0.9.0's own webhook sender (`webhook.New(url).CommandAndReportResults`), %d enrollments at a time, each "+
		"enrollment's two results one after the other as a device answers its queue (so at most %d webhook requests in flight, on "+
		"connections opened beforehand).\n\n", e.Server, e.N, 2*e.N, e.Inflight, e.Inflight)
	fmt.Fprintf(&b, "- **%s**: its own server, `cmd/nanocmd` built from the module (`go build github.com/micromdm/nanocmd/cmd/nanocmd` in the bench "+
		"module; its `plist` dependency is v0.2.2, as in the main module: the module proxy does not serve v0.4.0), every flag at its "+
		"default but `-storage mysql -storage-dsn … -api … -enqueue-url … -push-url … -enqueue-api …`, on a fresh database with NanoCMD's "+
		"own `engine/storage/mysql/schema.sql` (and the profile subsystem's). Its NanoMDM is a fake in the bench process that answers "+
		"`PUT /v1/enqueue/{ids}` and `GET /v1/push/{ids}` 200 and records which command UUIDs were enqueued to each enrollment. The step "+
		"is started with one %s.", nc.Impl, nc.Start)
	if nc.MDM != nil {
		fmt.Fprintf(&b, " The fake got %d enqueue requests (%d of them with an empty body: NanoCMD enqueues to 30 ids a request and "+
			"sends every chunk after a command's first from the same, already read, buffer; each is attributed to the command before it), "+
			"%d commands to %d enrollments, %d pushes.", nc.MDM.Enqueues, nc.MDM.EmptyBodies, nc.MDM.Commands, nc.MDM.Enrollments, nc.MDM.Pushes)
	}
	b.WriteString(" NanoCMD sets no limits on its `sql.DB`, so database/sql keeps at most 2 idle connections: with many requests in " +
		"flight most of its statements open a connection of their own and close it after (the connections row). " +
		"**Every enrollment done**: `id_commands` holds no row (NanoCMD deletes an enrollment's rows, and collects the " +
		"step, in the request of the result that completes it), looked at once the last webhook is answered and every 10 ms after " +
		"that while it still holds rows: the later of the last answer and the look that found it empty.\n")
	fmt.Fprintf(&b, "- **%s**: the real `cmd/api` and one `cmd/worker` at their defaults (log level info) but for the worker's sweeper, "+
		"off (`-sweep-interval 0`, as in the service rows; NanoCMD's own worker, every 300 s by default, does not run within the run "+
		"either), Redis a private `redis-server`; the step is stored with one %s. **Every enrollment done**: the arrival of the last "+
		"of the N distinct `step.completed` events at the receiver in the bench process.\n\n", sc.Impl, sc.Start)
	b.WriteString("**CPU** is each process's user + system time from `/proc/<pid>/stat`, over a window from the release of the first " +
		"webhook to every enrollment done and, for stepcollect, on to the outbox empty and the step collected (what the run caused, " +
		"looked at every 10 ms); **per webhook** divides the service's and mariadbd's by the webhooks sent. The service is " +
		"`nanocmd` for NanoCMD and `api` + `worker` + `redis-server` for stepcollect. **Statements per result** are the server's " +
		"`SHOW GLOBAL STATUS` deltas over the same window (`Com_*`, `Questions`, `Connections`; the bench's mariadbd is private, so " +
		"they are this run's alone), less the bench's own looks at the tables and the closing `SHOW`, divided by the webhooks sent. " +
		"A prepared statement's execution counts under its kind (NanoCMD's driver prepares every statement with arguments, " +
		"stepcollect interpolates them); the prepares are shown apart. What the server does in the background after the window " +
		"(purge, page flushing) is counted for neither. Webhook latencies are each request's own, from sending it to its answer. " +
		"**ratio** is stepcollect ÷ NanoCMD.\n\n")
	if e.Shared {
		b.WriteString("**This run used a shared server (`-server`)**: the statement counters and mariadbd's CPU include whatever else it ran, and mariadbd's CPU was not measured.\n\n")
	}

	ratio := func(a, b float64) string {
		if a == 0 || b == 0 {
			return "–"
		}
		return fmt.Sprintf("%.2f×", b/a)
	}
	doneStr := func(r *e2eRun) string {
		if r.DoneMS == 0 {
			return fmt.Sprintf("not within the wait (%d of %d done)", r.Done, e.N)
		}
		return dur(r.DoneMS)
	}
	sec := func(ms float64) string { return fmt.Sprintf("%.2f s", ms/1000) }
	split := func(r *e2eRun) string {
		var parts []string
		for _, p := range r.Service {
			parts = append(parts, fmt.Sprintf("%s %.3f", p, r.CPU[p]/float64(max(r.Webhooks, 1))))
		}
		return strings.Join(parts, " + ")
	}
	procs := func(r *e2eRun) string {
		var parts []string
		for _, p := range r.Service {
			parts = append(parts, fmt.Sprintf("%s %s", p, sec(r.CPU[p])))
		}
		return strings.Join(parts, ", ")
	}
	fmt.Fprintf(&b, "| | %s | %s | ratio |\n|---|--:|--:|--:|\n", nc.Impl, sc.Impl)
	fmt.Fprintf(&b, "| **release to every enrollment done** | %s | %s | %s |\n", doneStr(nc), doneStr(sc), ratio(nc.DoneMS, sc.DoneMS))
	fmt.Fprintf(&b, "| release to the last webhook answered | %s | %s | %s |\n", dur(nc.LastAnswerMS), dur(sc.LastAnswerMS), ratio(nc.LastAnswerMS, sc.LastAnswerMS))
	fmt.Fprintf(&b, "| webhooks answered 200 / sent | %d / %d%s | %d / %d%s | |\n", nc.OK, nc.Webhooks, errSuffix(nc.Errors), sc.OK, sc.Webhooks, errSuffix(sc.Errors))
	fmt.Fprintf(&b, "| **webhook p50** | %s | %s | %s |\n", dur(nc.P50MS), dur(sc.P50MS), ratio(nc.P50MS, sc.P50MS))
	fmt.Fprintf(&b, "| **webhook p99** | %s | %s | %s |\n", dur(nc.P99MS), dur(sc.P99MS), ratio(nc.P99MS, sc.P99MS))
	fmt.Fprintf(&b, "| **CPU per webhook, service + mariadbd** | %.3f ms | %.3f ms | %s |\n", nc.cpuPerWebhook(true, true), sc.cpuPerWebhook(true, true),
		ratio(nc.cpuPerWebhook(true, true), sc.cpuPerWebhook(true, true)))
	fmt.Fprintf(&b, "| … the service | %.3f ms (%s) | %.3f ms (%s) | %s |\n", nc.cpuPerWebhook(true, false), split(nc), sc.cpuPerWebhook(true, false), split(sc),
		ratio(nc.cpuPerWebhook(true, false), sc.cpuPerWebhook(true, false)))
	fmt.Fprintf(&b, "| … mariadbd | %.3f ms | %.3f ms | %s |\n", nc.cpuPerWebhook(false, true), sc.cpuPerWebhook(false, true),
		ratio(nc.cpuPerWebhook(false, true), sc.cpuPerWebhook(false, true)))
	fmt.Fprintf(&b, "| CPU seconds: service processes | %s | %s | %s |\n", procs(nc), procs(sc), ratio(nc.cpuMS(true, false), sc.cpuMS(true, false)))
	fmt.Fprintf(&b, "| CPU seconds: mariadbd | %s | %s | %s |\n", sec(nc.CPU["mariadbd"]), sec(sc.CPU["mariadbd"]), ratio(nc.CPU["mariadbd"], sc.CPU["mariadbd"]))
	fmt.Fprintf(&b, "| CPU seconds: the bench process (sender, fake NanoMDM, receiver; not counted) | %s | %s | |\n", sec(nc.CPU["bench"]), sec(sc.CPU["bench"]))
	fmt.Fprintf(&b, "| window (release to the end of the CPU and statement window) | %s | %s | |\n", dur(nc.WindowMS), dur(sc.WindowMS))
	for _, k := range statementKinds {
		a, c := nc.perResult(k.vars...), sc.perResult(k.vars...)
		fmt.Fprintf(&b, "| statements per result: %s | %.2f | %.2f | %s |\n", k.label, a, c, ratio(a, c))
	}
	fmt.Fprintf(&b, "| statements per result: other (`Questions` less the above: SET, a connection's QUIT, …) | %.2f | %.2f | %s |\n", nc.otherStatements(), sc.otherStatements(), ratio(nc.otherStatements(), sc.otherStatements()))
	fmt.Fprintf(&b, "| **statements per result: all** (`Questions`) | %.2f | %.2f | %s |\n", nc.perResult("Questions"), sc.perResult("Questions"),
		ratio(nc.perResult("Questions"), sc.perResult("Questions")))
	fmt.Fprintf(&b, "| prepares per result (`Com_stmt_prepare`; executions counted above) | %.2f | %.2f | %s |\n", nc.perResult("Com_stmt_prepare"), sc.perResult("Com_stmt_prepare"),
		ratio(nc.perResult("Com_stmt_prepare"), sc.perResult("Com_stmt_prepare")))
	fmt.Fprintf(&b, "| connections opened per result (`Connections`) | %.2f | %.2f | %s |\n", nc.perResult("Connections"), sc.perResult("Connections"),
		ratio(nc.perResult("Connections"), sc.perResult("Connections")))
	fmt.Fprintf(&b, "| left behind: steps / id_commands / step_commands | %d / %d / %d | %d / %d / %d | |\n\n",
		nc.Stranded.Steps, nc.Stranded.IDCommands, nc.Stranded.StepCommands, sc.Stranded.Steps, sc.Stranded.IDCommands, sc.Stranded.StepCommands)
	if sc.EventsReceived > sc.EventsDistinct || sc.OutboxLeft > 0 {
		fmt.Fprintf(&b, "stepcollect: %s events received / distinct, %d left in the outbox at the end of the window.\n\n",
			eventsString(sc.EventsReceived, sc.EventsDistinct), sc.OutboxLeft)
	}
	b.WriteString(e.goals())
	b.WriteString("\n")

	b.WriteString("### Where the CPU goes\n\n")
	for _, r := range e.Runs {
		if r.ProfileNote != "" {
			fmt.Fprintf(&b, "%s: %s\n\n", r.Impl, strings.TrimSpace(r.ProfileNote))
		}
		for _, p := range r.Profiles {
			fmt.Fprintf(&b, "%s's `%s`, the whole life of the process (the `POST /v1/steps` and the webhooks), `go tool pprof -top -nodecount=10` "+
				"(flat: time in the function itself), from `%s`:\n\n```\n%s\n```\n\n", r.Impl, p.Process, p.Path, strings.TrimSpace(p.Top))
		}
	}
	return b.String()
}

// goals are the section's two goal lines.
func (e *e2eResult) goals() string {
	if len(e.Runs) != 2 {
		return ""
	}
	nc, sc := e.Runs[0], e.Runs[1]
	var b strings.Builder
	verdict := "missed"
	detail := ""
	switch {
	case sc.DoneMS == 0:
		detail = "stepcollect did not finish within the wait"
	case nc.DoneMS == 0:
		verdict, detail = "met", fmt.Sprintf("stepcollect %s; NanoCMD did not finish within the wait", dur(sc.DoneMS))
	default:
		x := sc.DoneMS / nc.DoneMS
		if x <= 0.5 && sc.OK == sc.Webhooks {
			verdict = "met"
		}
		detail = fmt.Sprintf("%s vs %s, %.2f× NanoCMD's time", dur(sc.DoneMS), dur(nc.DoneMS), x)
	}
	fmt.Fprintf(&b, "- **End to end at N=%d: every enrollment done in at most half of NanoCMD's time** (%s): %s: **%s**.\n", e.N, e.Server, detail, verdict)
	cpu := sc.cpuPerWebhook(true, true)
	verdict = "met"
	if cpu > 1.5 || sc.Webhooks == 0 || e.Shared {
		verdict = "missed"
	}
	if e.Shared {
		verdict = "not judged: a shared server's CPU is not measured"
	}
	fmt.Fprintf(&b, "- **End to end at N=%d: at most 1.5 ms CPU per webhook** (stepcollect, service + mariadbd): %.3f ms (NanoCMD v0.7.1: %.3f ms): **%s**.\n",
		e.N, cpu, nc.cpuPerWebhook(true, true), verdict)
	return b.String()
}

func errSuffix(m map[string]int) string {
	if sum(m) == 0 {
		return ""
	}
	return " (" + errString(m) + ")"
}
