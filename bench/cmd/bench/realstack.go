package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

// The real-stack section: NanoMDM v0.9.0's own server (inmem storage, no
// APNs certificate: its pushes fail, and mdmsim's Wake stands in for
// them) with N simulated Macs enrolled in it, its webhook at a NanoCMD
// server through a proxy that counts the posts and their answers; the
// inventory workflow started through the server's API, and the clock
// stopped when every device's values are in the server's inventory route.

const (
	realStackMDMBinary = "nanomdm" // in -bin, built by the Makefile's bench-build
	// device i's UDID is the prefix and i in six digits: 25 characters,
	// an Apple silicon Mac's
	realStackUDIDPrefix = "00008103-001A2B3C4D"
	// no new result for this long: the rest are not coming
	realStackStall = 15 * time.Second
	// NanoCMD v0.7.1's ids a request to NanoMDM (mdm/foss): one command
	// UUID reaches no more, so its operator starts a workflow 30 ids at a
	// time
	nanocmdIDsPerEnqueue = 30
)

// realStackServer is a row's server.
type realStackServer struct {
	Label  string
	Binary string // in -bin, or a path
	// Own is NanoCMD v0.7.1's server: its schema or its file storage, a
	// start each 30 ids. Else stepcollect's: an empty database, one start.
	Own bool
}

// realStackResult is the section: one run a server.
type realStackResult struct {
	Mode   string          `json:"mode"` // "realstack"
	N      int             `json:"n"`
	Before string          `json:"before,omitempty"` // -realstack-before
	Runs   []*realStackRun `json:"runs"`
}

// realStackRun is one server's run.
type realStackRun struct {
	Server  string `json:"server"`
	Storage string `json:"storage"`
	// Starts are the workflow starts sent, StartAnswers their answers by
	// status, StartNote the first answer other than 200.
	Starts       int            `json:"starts"`
	StartAnswers map[string]int `json:"start_answers"`
	StartNote    string         `json:"start_note,omitempty"`
	// Reached are the devices whose command reports NanoMDM posted; Done
	// those whose values are in the inventory route.
	Reached int `json:"devices_reached"`
	Done    int `json:"devices_done"`
	// From the first start: to every device done (0: not within the
	// wait), and to the end of the window the CPU times are taken over.
	DoneMS   float64            `json:"done_ms"`
	WindowMS float64            `json:"window_ms"`
	Webhooks webhookCounts      `json:"webhooks"`
	CPU      map[string]float64 `json:"cpu_ms"` // "nanocmd", "nanomdm", the database server's
	DB       string             `json:"db_process,omitempty"`
	// Refused are NanoMDM's log lines of a command it already holds.
	Refused     int      `json:"nanomdm_refused"`
	FleetErrors []string `json:"fleet_errors,omitempty"`
}

// realStack runs the section: stepcollect's nanocmd on the bench's server,
// NanoCMD v0.7.1's on MySQL (-mysql-dsn) or its file storage, and, when
// before names one, an older build of stepcollect's nanocmd as the first.
func (r *runner) realStack(n int, before string) (*realStackResult, error) {
	res := &realStackResult{Mode: "realstack", N: n, Before: before}
	own := r.ownTarget(configs[0])
	var theirs *dbTarget
	if r.mysqlSrv != nil {
		t := r.mysqlTarget(mysqlConfigs(r.mysqlSrv, 1000)[0])
		theirs = &t
	}
	rows := []struct {
		srv realStackServer
		db  *dbTarget
	}{
		{realStackServer{Label: "stepcollect `nanocmd`", Binary: e2eDropInBinary}, &own},
		{realStackServer{Label: "NanoCMD v0.7.1 `nanocmd`", Binary: e2eBinary, Own: true}, theirs},
	}
	if before != "" {
		rows = append(rows, struct {
			srv realStackServer
			db  *dbTarget
		}{realStackServer{Label: "before: stepcollect `nanocmd`, `" + filepath.Base(before) + "`", Binary: before}, &own})
	}
	for _, row := range rows {
		run, err := r.realStackRun(row.srv, row.db, n)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", row.srv.Label, err)
		}
		res.Runs = append(res.Runs, run)
	}
	return res, nil
}

// realStackRun runs srv on its storage with NanoMDM and n devices, and
// measures from the first start to every device done.
func (r *runner) realStackRun(srv realStackServer, db *dbTarget, n int) (*realStackRun, error) {
	r.step++
	progress("[%d/%d] %-28s N=%-5d through NanoMDM's own server, the inventory workflow …", r.step, max(r.total, r.step), srv.Label, n)
	dir, err := os.MkdirTemp("", "bench-realstack-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	run := &realStackRun{Server: srv.Label}
	storage, drop, err := r.realStackStorage(srv, db, dir, run)
	if err != nil {
		return nil, err
	}
	defer drop()

	port, err := testkit.PickPort()
	if err != nil {
		return nil, err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	proxy, err := startWebhookProxy(base)
	if err != nil {
		return nil, err
	}
	defer proxy.close()
	mdm, stopMDM, err := nanomdm.StartProcess(dir, nanomdm.Options{Binary: filepath.Join(r.bin, realStackMDMBinary), WebhookURL: proxy.URL + "/webhook"})
	if err != nil {
		return nil, fmt.Errorf("%w (make bench-build builds %s)", err, realStackMDMBinary)
	}
	defer stopMDM()
	bin := srv.Binary
	if !filepath.IsAbs(bin) {
		bin = filepath.Join(r.bin, bin)
	}
	nc, err := startProc(bin, nil, append([]string{"-listen", fmt.Sprintf("127.0.0.1:%d", port), "-api", e2eAPIKey,
		"-enqueue-url", mdm.EnqueueURL, "-push-url", mdm.PushURL, "-enqueue-api", mdm.APIKey}, storage...)...)
	if err != nil {
		return nil, err
	}
	defer nc.stop()
	if err := awaitOK(base+"/version", 30*time.Second); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, nc.logs.String())
	}
	fleet, err := enrolledFleet(mdm, n)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { fleet.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	client := warmedClient(base+"/version", 4)

	pids := map[string]int{"nanocmd": nc.cmd.Process.Pid, "nanomdm": mdm.Proc.PID()}
	if db != nil && db.pid > 0 {
		pids[db.proc], run.DB = db.pid, db.proc
	}
	r.settle()
	proxy.reset()
	cpu0 := cpuTimes(pids)
	t0 := time.Now()
	if err := realStackStart(run, srv, client, base, fleet); err != nil {
		return nil, fmt.Errorf("%v\n%s", err, nc.logs.String())
	}
	// every report answered, then every device's values in the inventory
	// route: the route is asked only once there is something to find
	_, left := awaitZero(func() (int, error) { return 2*n - proxy.resultsOK(), nil }, realStackStall, e2eWait)
	serials := map[string]string{}
	for _, d := range fleet.Devices() {
		serials[d.UDID] = d.Serial
	}
	lacking := func() (int, error) {
		return inventoryLacking(client, base, fleet.IDs(), func(id string) string { return serials[id] })
	}
	if left == 0 {
		doneAt, notDone := awaitZero(lacking, 10*time.Second, e2eWait)
		run.Done = n - notDone
		if notDone == 0 {
			run.DoneMS = fanout.MS(doneAt.Sub(t0))
		}
	} else if notDone, err := lacking(); err == nil {
		run.Done = n - notDone
	}
	cpu := cpuTimes(pids)
	run.WindowMS = fanout.MS(time.Since(t0))
	run.CPU = map[string]float64{}
	for name := range pids {
		run.CPU[name] = cpu[name] - cpu0[name]
	}
	run.Webhooks = proxy.counts()
	run.Reached = len(run.Webhooks.reached)
	run.Refused = strings.Count(mdm.Logs(), "command already exists")
	for _, err := range fleet.Errors() {
		run.FleetErrors = append(run.FleetErrors, err.Error())
	}
	realStackDone(run, n)
	return run, nil
}

// realStackStorage makes srv's storage in db (stepcollect's on an empty
// database, NanoCMD's on one with its schema), or with no db NanoCMD's
// file storage in dir, describes it in run, and returns its flags.
func (r *runner) realStackStorage(srv realStackServer, db *dbTarget, dir string, run *realStackRun) ([]string, func(), error) {
	if db == nil {
		run.Storage = "its file storage (no `-mysql-dsn`; on MariaDB every start of v0.7.1 answers 500)"
		return []string{"-storage", "file", "-storage-dsn", filepath.Join(dir, "nanocmd")}, func() {}, nil
	}
	dsn, drop, err := r.nanocmdDatabase(nanocmdServer{Schema: srv.Own}, *db)
	if err != nil {
		return nil, nil, err
	}
	// "10.11.19-MariaDB-0+deb12u1-log", "9.7.4-2, binary log on, …": the
	// version alone
	version, _, _ := strings.Cut(r.version, "-")
	if db.Name != "MariaDB" {
		version, _, _ = strings.Cut(r.mysqlSrv.version, "-")
	}
	run.Storage = fmt.Sprintf("`-storage mysql`, %s %s", db.Name, version)
	if srv.Own {
		run.Storage = fmt.Sprintf("its MySQL storage, %s %s", db.Name, version)
	}
	return []string{"-storage", "mysql", "-storage-dsn", dsn}, drop, nil
}

// enrolledFleet is n devices enrolled in mdm. They poll when woken (the
// push NanoMDM cannot send) and otherwise once an hour, so that no Idle
// poll of theirs falls in the window.
func enrolledFleet(mdm *nanomdm.Server, n int) (*mdmsim.Fleet, error) {
	fleet, err := mdmsim.NewFleet(mdm.CA, mdmsim.Target{MDMURL: mdm.MDMURL, CertHeader: mdm.CertHeader},
		mdmsim.FleetConfig{N: n, UDIDPrefix: realStackUDIDPrefix, PollEvery: time.Hour})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := fleet.Enroll(ctx); err != nil {
		return nil, fmt.Errorf("enrolling: %w\n%s", err, mdm.Logs())
	}
	return fleet, nil
}

// realStackStart starts the inventory workflow for every device, as srv's
// operator can: one start for all, or (NanoCMD v0.7.1) one each 30 ids,
// and wakes each start's devices once it is answered.
func realStackStart(run *realStackRun, srv realStackServer, client *http.Client, base string, fleet *mdmsim.Fleet) error {
	ids := fleet.IDs()
	size := len(ids)
	if srv.Own {
		size = nanocmdIDsPerEnqueue
	}
	run.StartAnswers = map[string]int{}
	for chunk := range slices.Chunk(ids, size) {
		status, body, err := startWorkflow(client, base, chunk)
		if err != nil {
			return err
		}
		run.Starts++
		run.StartAnswers[status]++
		if status != "200 OK" && run.StartNote == "" {
			run.StartNote = fmt.Sprintf("%s `%.300s`", status, strings.TrimSpace(body))
		}
		fleet.Wake(chunk...)
	}
	return nil
}

// startWorkflow starts the inventory workflow for ids in one request and
// returns its answer.
func startWorkflow(client *http.Client, base string, ids []string) (status, body string, err error) {
	q := url.Values{}
	for _, id := range ids {
		q.Add("id", id)
	}
	req, _ := http.NewRequest("POST", base+"/v1/workflow/"+e2eWorkflow+"/start?"+q.Encode(), nil)
	req.SetBasicAuth("nanocmd", e2eAPIKey)
	resp, err := client.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("starting the workflow: %w", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b), nil
}

func realStackDone(run *realStackRun, n int) {
	done := fmt.Sprintf("%d of %d devices done, %d reached", run.Done, n, run.Reached)
	if run.DoneMS > 0 {
		done = "every device done in " + dur(run.DoneMS)
	}
	w := run.Webhooks
	fmt.Fprintf(os.Stderr, " %s, %d webhooks (%d results), %d non-2xx, %s ms nanocmd CPU a result\n",
		done, w.Posts, w.Results, w.Non2xx, run.perResult("nanocmd"))
}

// perResult is process name's CPU time per command report NanoMDM posted,
// in ms, or "–" where there was none.
func (run *realStackRun) perResult(name string) string {
	cpu, ok := run.CPU[name]
	if !ok || run.Webhooks.Results == 0 {
		return "–"
	}
	return fmt.Sprintf("%.3f", cpu/float64(run.Webhooks.Results))
}

// markdown is the section's table and what each run's starts answered.
func (s *realStackResult) markdown() string {
	if len(s.Runs) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "## Through NanoMDM's own server: the inventory workflow for N=%d devices\n\n"+
		"NanoMDM v0.9.0's own server (`cmd/nanomdm`, inmem storage), %d simulated Macs (`internal/testkit/mdmsim`, UDIDs of 25 "+
		"characters) enrolled in it, its webhook at the server under test through a proxy in the bench process that counts every "+
		"post and its answer. NanoMDM has no APNs certificate here, so its pushes fail: each start's devices are woken when the "+
		"start is answered, as a push would, and poll only then (else once an hour). Each device reports Idle, then answers "+
		"DeviceInformation and SecurityInfo: three webhooks, two of them results. The servers run with every flag at its default "+
		"but `-storage … -storage-dsn … -api … -enqueue-url … -push-url … -enqueue-api …`, after the database servers are quiet. "+
		"stepcollect's `nanocmd` is started once for all N; NanoCMD v0.7.1's own enqueues a command UUID in requests of 30 ids, and "+
		"NanoMDM stores a UUID once, so it reaches 30 devices a start: it is started once each 30 ids, one after another. "+
		"**Time to all done** is from the first start to every device's serial number and SIP state in the inventory route "+
		"(`GET /inventory`), asked once every result was answered 2xx; a run that gets no new result for %s is not done. "+
		"**CPU per result** is the process's user + system time over that span divided by the results NanoMDM posted.\n\n",
		s.N, s.N, realStackStall)
	b.WriteString("| server | N | devices done | webhooks sent | non-2xx | time to all done | server CPU per result (ms) | NanoMDM CPU per result (ms) |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, run := range s.Runs {
		done := dur(run.DoneMS)
		if run.DoneMS == 0 {
			done = fmt.Sprintf("not done (%d of %d after %s)", run.Done, s.N, dur(run.WindowMS))
		}
		fmt.Fprintf(&b, "| %s (%s; %s) | %d | %d | %d (%d results) | %d | %s | %s | %s |\n", run.Server, run.Storage, startsString(run.Starts),
			s.N, run.Done, run.Webhooks.Posts, run.Webhooks.Results, run.Webhooks.Non2xx, done, run.perResult("nanocmd"), run.perResult("nanomdm"))
	}
	b.WriteString("\n")
	for _, run := range s.Runs {
		fmt.Fprintf(&b, "- %s: starts answered %s%s; %d of %d devices handed a command, results of %d command UUIDs; "+
			"NanoMDM refused a command UUID it already held %d times",
			run.Server, answersString(run.StartAnswers), ifs(run.StartNote != "", ", the first other than 200: "+run.StartNote),
			run.Reached, s.N, run.Webhooks.UUIDs, run.Refused)
		if run.DB != "" {
			fmt.Fprintf(&b, "; %s CPU per result %s ms", run.DB, run.perResult(run.DB))
		}
		if len(run.FleetErrors) > 0 {
			fmt.Fprintf(&b, "; device errors: %s", strings.Join(run.FleetErrors, "; "))
		}
		b.WriteString(".\n")
	}
	fmt.Fprintf(&b, "\nThis section alone: `make bench BENCH_FLAGS='-only realstack -realstack-n %d%s'`.\n\n", s.N, ifs(s.Before != "", " -realstack-before "+s.Before))
	return b.String()
}

func startsString(k int) string {
	if k == 1 {
		return "1 start"
	}
	return fmt.Sprintf("%d starts", k)
}

// answersString is the start answers by status, most first.
func answersString(m map[string]int) string {
	var parts []string
	for status, k := range m {
		parts = append(parts, fmt.Sprintf("%d × %s", k, status))
	}
	slices.SortFunc(parts, func(a, b string) int { return strings.Compare(b, a) })
	return strings.Join(parts, ", ")
}

// webhookProxy passes NanoMDM's webhook posts on to the server under test
// and counts them and the server's answers.
type webhookProxy struct {
	URL string
	srv *http.Server
	mu  sync.Mutex
	c   webhookCounts
}

// webhookCounts are the posts since the proxy's last reset.
type webhookCounts struct {
	Posts     int            `json:"posts"`
	Results   int            `json:"results"` // command reports: not Idle, not check-ins
	ResultsOK int            `json:"results_2xx"`
	Non2xx    int            `json:"non_2xx"` // of every post; no answer counts as 502
	Statuses  map[string]int `json:"statuses"`
	UUIDs     int            `json:"command_uuids"` // distinct, among the results
	reached   map[string]bool
	uuids     map[string]bool
}

// startWebhookProxy starts a proxy to target (a base URL) on a free port.
func startWebhookProxy(target string) (*webhookProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 64}
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	p := &webhookProxy{URL: "http://" + ln.Addr().String()}
	p.reset()
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, err := io.ReadAll(req.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		rp.ServeHTTP(sw, req)
		p.count(body, sw.code)
	})}
	go p.srv.Serve(ln)
	return p, nil
}

// count records a post of body answered code.
func (p *webhookProxy) count(body []byte, code int) {
	var ev struct {
		Ack *struct {
			UDID        string `json:"udid"`
			CommandUUID string `json:"command_uuid"`
		} `json:"acknowledge_event"`
	}
	json.Unmarshal(body, &ev)
	ok := code >= 200 && code < 300
	p.mu.Lock()
	defer p.mu.Unlock()
	p.c.Posts++
	p.c.Statuses[strconv.Itoa(code)]++
	if !ok {
		p.c.Non2xx++
	}
	if ev.Ack != nil && ev.Ack.CommandUUID != "" {
		p.c.Results++
		p.c.reached[ev.Ack.UDID] = true
		p.c.uuids[ev.Ack.CommandUUID] = true
		p.c.UUIDs = len(p.c.uuids)
		if ok {
			p.c.ResultsOK++
		}
	}
}

func (p *webhookProxy) reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.c = webhookCounts{Statuses: map[string]int{}, reached: map[string]bool{}, uuids: map[string]bool{}}
}

// counts is a copy of the counts now.
func (p *webhookProxy) counts() webhookCounts {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.c
	c.Statuses, c.reached, c.uuids = maps.Clone(p.c.Statuses), maps.Clone(p.c.reached), maps.Clone(p.c.uuids)
	return c
}

// resultsOK is how many command reports the server answered 2xx.
func (p *webhookProxy) resultsOK() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.c.ResultsOK
}

func (p *webhookProxy) close() { p.srv.Close() }

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}
