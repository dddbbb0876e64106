package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// e2eStepcollect runs stepcollect's api and one worker (at their defaults:
// log level info, the sweeper on) on the same work: one POST /v1/steps of
// the same two commands to the n enrollments, then the same results
// through the same sender, inflight at a time. Every enrollment is done
// when its step.completed event has arrived at the receiver. The CPU and
// statement window goes on until the outbox is empty (every event
// acknowledged) and the step collected, looked at every 10 ms.
func (r *runner) e2eStepcollect(cfg serverConfig, n, inflight int, outDir string) (*e2eRun, error) {
	r.e2eAnnounce(e2eStepcollect, cfg.Name, n)
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
	w, err := r.openWindow(r.admin, pids)
	if err != nil {
		return nil, err
	}
	sent := sendResults(webhook.New(e.apiURL+"/webhook", webhook.WithClient(e.client)), jobs, inflight, w.t0)
	run.fill(sent)

	// every enrollment done: its step.completed at the receiver
	e.recv.AwaitCompletions(n, 30*time.Second, e2eWait)
	received, distinct, last := e.recv.Completions()
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
	if err := e.db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands), (SELECT COUNT(*) FROM stepcollect_outbox)`).
		Scan(&run.Stranded.Steps, &run.Stranded.IDCommands, &run.Stranded.StepCommands, &run.OutboxLeft); err != nil {
		return nil, fmt.Errorf("counting stranded rows: %w", err)
	}

	// the profiles are written when the processes stop
	e.close()
	closed = true
	r.addProfile(run, "api", "api", apiProf)
	r.addProfile(run, "worker", "worker", workerProf)
	r.e2eDone(run)
	return run, nil
}

// addProfile adds process's CPU profile at path (of binary, in -bin) to
// run, as pprof's top 10, or says why not.
func (r *runner) addProfile(run *e2eRun, process, binary, path string) {
	out, err := exec.Command("go", "tool", "pprof", "-top", "-nodecount=10", filepath.Join(r.bin, binary), path).CombinedOutput()
	if err != nil {
		run.ProfileNote += fmt.Sprintf("go tool pprof %s: %v: %s. ", path, err, strings.TrimSpace(string(out)))
		return
	}
	run.Profiles = append(run.Profiles, e2eProfile{Process: process, Path: filepath.Base(path), Top: string(out)})
}
