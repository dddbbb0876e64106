package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

// nanocmdServer is a server run with NanoCMD v0.7.1's command line:
// NanoCMD's own, or stepcollect's cmd/nanocmd in its place.
type nanocmdServer struct {
	Impl   string // the row's label
	Binary string // in -bin, built by the Makefile's bench-build
	// Schema: NanoCMD's schema.sql is loaded first, as its operator must;
	// stepcollect's makes its tables at start on an empty database.
	Schema bool
}

var (
	nanocmdOwn  = nanocmdServer{Impl: e2eNanoCMD, Binary: e2eBinary, Schema: true}
	nanocmdOurs = nanocmdServer{Impl: e2eDropIn, Binary: e2eDropInBinary}
)

// e2eNanoCMD runs srv on a fresh database of db, its NanoMDM the fake in
// the bench process; starts the inventory workflow for all n ids in one
// request, then answers every command enqueued through NanoMDM's webhook
// sender, inflight at a time. Every enrollment is done when its values are
// in the inventory route: id_commands is looked at after the last answer
// (and every 10 ms while it holds rows: both servers delete an
// enrollment's rows in the request of the result that completes its step,
// and store its inventory in the same request), then the route is asked
// for all n ids, again every 100 ms until each has its values.
//
// profile, when set, is where stepcollect's server writes its CPU profile
// (NanoCMD's has no way to).
func (r *runner) e2eNanoCMD(srv nanocmdServer, db dbTarget, n, inflight int, profile string) (*e2eRun, error) {
	r.e2eAnnounce(srv.Impl, db.Name, n)
	dsn, drop, err := r.nanocmdDatabase(srv, db)
	if err != nil {
		return nil, err
	}
	defer drop()
	sqlDB, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	defer sqlDB.Close()
	probe, err := sqlDB.Conn(context.Background())
	if err != nil {
		return nil, err
	}
	defer probe.Close()

	fake, err := startFakeMDM(e2eMDMKey)
	if err != nil {
		return nil, err
	}
	defer fake.close()
	port, err := testkit.PickPort()
	if err != nil {
		return nil, err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	// every setting at its default but what it cannot run without: the
	// same command line for both servers
	var env []string
	if profile != "" {
		os.Remove(profile)
		env = []string{"STEPCOLLECT_CPU_PROFILE=" + profile}
	}
	nc, err := startProc(filepath.Join(r.bin, srv.Binary), env, "-listen", fmt.Sprintf("127.0.0.1:%d", port),
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
	for i := range ids {
		ids[i] = e2eEnrollment(i)
	}
	start, err := startInventory(client, base, ids, nc)
	if err != nil {
		return nil, err
	}
	order, cmds := fake.enrollments()
	st := fake.stats()
	if st.Enrollments != n || st.Commands != 2*n || st.Unattributed > 0 || st.BadBodies > 0 || st.Unauthorized > 0 {
		return nil, fmt.Errorf("the fake NanoMDM got commands for %d of %d enrollments, %d of %d commands (%+v)\n%s",
			st.Enrollments, n, st.Commands, 2*n, st, nc.logs.String())
	}
	var stepRows int
	if err := sqlDB.QueryRow(`SELECT COUNT(*) FROM steps`).Scan(&stepRows); err != nil {
		return nil, fmt.Errorf("counting steps: %w", err)
	}
	if stepRows != 1 {
		return nil, fmt.Errorf("%d steps stored, want 1", stepRows)
	}
	jobs := make([]e2eJob, len(order))
	for i, id := range order {
		jobs[i] = e2eJob{id: id, cmds: cmds[id]}
	}

	run := &e2eRun{Impl: srv.Impl, Server: db.Name, Start: start, Service: []string{"nanocmd"}, DB: db.proc}
	if profile == "" {
		run.ProfileNote = "NanoCMD has no profiling flag or endpoint: no profile."
	}
	pids := map[string]int{"nanocmd": nc.cmd.Process.Pid, "bench": os.Getpid()}
	if db.pid > 0 {
		pids[db.proc] = db.pid
	}
	r.settle()
	w, err := r.openWindow(db.admin, pids)
	if err != nil {
		return nil, err
	}
	sent := sendResults(webhook.New(base+"/webhook", webhook.WithClient(client)), jobs, inflight, w.t0)
	run.fill(sent)

	// every enrollment done: id_commands empty, then every enrollment's
	// values in the inventory route (each look at the table is a statement
	// of the bench's, taken out below; the route's reads are the server's
	// own, and counted)
	probes := 0
	left := func() (int, error) {
		probes++
		var k int
		err := probe.QueryRowContext(context.Background(), `SELECT COUNT(DISTINCT enrollment_id) FROM id_commands`).Scan(&k)
		return k, err
	}
	awaitZero(left, 10*time.Second, e2eWait)
	missing := func() (int, error) { return inventoryMissing(client, base, ids) }
	doneAt, notDone := awaitZero(missing, 10*time.Second, e2eWait)
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
	if err := sqlDB.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands)`).
		Scan(&run.Stranded.Steps, &run.Stranded.IDCommands, &run.Stranded.StepCommands); err != nil {
		return nil, fmt.Errorf("counting stranded rows: %w", err)
	}
	if profile != "" {
		nc.stop() // the profile is written when the process stops
		r.addProfile(run, "nanocmd", srv.Binary, profile)
	}
	r.e2eDone(run)
	return run, nil
}

// nanocmdDatabase is a fresh database on db for srv: NanoCMD's schema
// loaded for NanoCMD's own server, empty for stepcollect's.
func (r *runner) nanocmdDatabase(srv nanocmdServer, db dbTarget) (string, func(), error) {
	if !srv.Schema {
		return emptyDatabase(db.admin, db.dsn, db.params)
	}
	schema, err := os.ReadFile(filepath.Join(r.bin, e2eSchema))
	if err != nil {
		return "", nil, fmt.Errorf("%v (make bench-build copies it from NanoCMD's module)", err)
	}
	return freshNanoCMDDatabase(db.admin, db.dsn, string(schema), db.params)
}

// startInventory starts the inventory workflow for ids in one request, and
// describes its answer.
func startInventory(client *http.Client, base string, ids []string, nc *proc) (string, error) {
	q := url.Values{}
	for _, id := range ids {
		q.Add("id", id)
	}
	req, _ := http.NewRequest("POST", base+"/v1/workflow/"+e2eWorkflow+"/start?"+q.Encode(), nil)
	req.SetBasicAuth("nanocmd", e2eAPIKey)
	resp, err := client.Do(req)
	if err != nil {
		return "", fmt.Errorf("starting the workflow: %w", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	start := fmt.Sprintf("`POST /v1/workflow/%s/start` with %d `id` parameters: %s", e2eWorkflow, len(ids), resp.Status)
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode == http.StatusInternalServerError && bytes.Contains(body, []byte("recording workflow status")):
		// MariaDB has no INSERT … AS new: NanoCMD's wf_status upsert fails
		// after the step is stored and its commands enqueued
		start += fmt.Sprintf(" (expected on MariaDB, which has no `INSERT … AS new`: NanoCMD's `wf_status` upsert fails after the step "+
			"is stored and its commands enqueued; `%s`)", strings.TrimSpace(string(body)))
	default:
		return "", fmt.Errorf("workflow start: %s %s\n%s", resp.Status, body, nc.logs.String())
	}
	return start, nil
}

// inventoryMissing asks the inventory route (`GET /inventory`, where
// NanoCMD v0.7.1 serves it) for ids, and counts those without both
// commands' values: the serial number DeviceInformation answered and
// SecurityInfo's SIP state.
func inventoryMissing(client *http.Client, base string, ids []string) (int, error) {
	return inventoryLacking(client, base, ids, func(id string) string { return "SN" + id })
}

// inventoryLacking is inventoryMissing of ids whose serial numbers are
// serial(id).
func inventoryLacking(client *http.Client, base string, ids []string, serial func(id string) string) (int, error) {
	q := url.Values{}
	for _, id := range ids {
		q.Add("id", id)
	}
	req, _ := http.NewRequest("GET", base+"/inventory?"+q.Encode(), nil)
	req.SetBasicAuth("nanocmd", e2eAPIKey)
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("GET /inventory: %s %s", resp.Status, b)
	}
	var inv map[string]map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&inv); err != nil {
		return 0, fmt.Errorf("GET /inventory: %w", err)
	}
	missing := 0
	for _, id := range ids {
		v := inv[id]
		if v["serial_number"] != serial(id) || v["sip_enabled"] == nil {
			missing++
		}
	}
	return missing, nil
}
