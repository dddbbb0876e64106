package main

import (
	"bytes"
	"context"
	"database/sql"
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
	port, err := testkit.PickPort()
	if err != nil {
		return nil, err
	}
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
