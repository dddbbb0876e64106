package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// proc is a binary the service measurement runs.
type proc struct {
	cmd  *exec.Cmd
	logs bytes.Buffer
}

func startProc(bin string, env []string, args ...string) (*proc, error) {
	p := &proc{cmd: exec.Command(bin, args...)}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.logs, &p.logs
	return p, p.cmd.Start()
}

func (p *proc) stop() {
	if p.cmd.Process != nil {
		p.cmd.Process.Signal(os.Interrupt)
		p.cmd.Wait()
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
		time.Sleep(50 * time.Millisecond)
	}
}

const benchAPIKey = "bench-api-key"

// service measures stepcollect as a service: the real cmd/api taking the
// results over HTTP as NanoMDM's webhook, the real cmd/worker collecting
// from a private Redis. Wall time and latencies are the HTTP requests';
// collection lag comes from the worker's own histogram.
func (r *runner) service(cfg serverConfig, n int, control bool) (*fanout.Result, error) {
	return r.serviceProfiled(cfg, n, control, "")
}

// serviceProfiled is service, with the api writing a CPU profile to
// profile when it is not empty.
func (r *runner) serviceProfiled(cfg serverConfig, n int, control bool, profile string) (*fanout.Result, error) {
	r.announce(implService, cfg, n, control, fanout.ModeFanOut)
	dsn, drop, err := freshDatabase(r.admin, r.server, merge(cfg.params, map[string]string{"interpolateParams": "true"}))
	if err != nil {
		return nil, err
	}
	defer drop()

	redisPort, _ := freePort()
	redis, err := startProc("redis-server", nil, "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--loglevel", "warning")
	if err != nil {
		return nil, fmt.Errorf("redis-server: %w", err)
	}
	defer redis.stop()
	apiPort, _ := freePort()
	workerPort, _ := freePort()
	env := []string{"STEPCOLLECT_MYSQL_DSN=" + dsn, fmt.Sprintf("STEPCOLLECT_REDIS_URL=redis://127.0.0.1:%d/0", redisPort),
		"STEPCOLLECT_LOG_LEVEL=warn"}
	worker, err := startProc(filepath.Join(r.bin, "worker"), env, "-metrics-listen", fmt.Sprintf("127.0.0.1:%d", workerPort))
	if err != nil {
		return nil, err
	}
	defer worker.stop()
	workerURL := fmt.Sprintf("http://127.0.0.1:%d", workerPort)
	if err := awaitOK(workerURL+"/readyz", 30*time.Second); err != nil {
		return nil, fmt.Errorf("worker: %v\n%s", err, worker.logs.String())
	}
	apiEnv := append(env, "STEPCOLLECT_API_KEY="+benchAPIKey, "STEPCOLLECT_MYSQL_MAX_CONNS="+strconv.Itoa(cfg.Pool))
	if profile != "" {
		apiEnv = append(apiEnv, "STEPCOLLECT_CPU_PROFILE="+profile)
	}
	api, err := startProc(filepath.Join(r.bin, "api"), apiEnv, "-listen", fmt.Sprintf("127.0.0.1:%d", apiPort))
	if err != nil {
		return nil, err
	}
	defer api.stop()
	apiURL := fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	if err := awaitOK(apiURL+"/readyz", 30*time.Second); err != nil {
		return nil, fmt.Errorf("api: %v\n%s", err, api.logs.String())
	}

	// At most pool requests in flight, on connections opened beforehand a
	// few at a time, as for the storage rows: NanoMDM's own concurrency is
	// bounded too, and ten thousand simultaneous connects would measure the
	// kernel's listen backlog, not the service.
	inflight := min(cfg.Pool, n)
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: inflight, MaxConnsPerHost: inflight}}
	for warmed := 0; warmed < inflight; warmed += 8 {
		var wg sync.WaitGroup
		for range min(8, inflight-warmed) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if resp, err := client.Get(apiURL + "/healthz"); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		wg.Wait()
	}

	// the steps, through /v1
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("SVC-%07d", i)
	}
	uuidOf := func(i int) string {
		if control {
			return fmt.Sprintf("SVC-UUID-%d", i)
		}
		return "SVC-UUID"
	}
	post := func(ids []string, uuid string) error {
		body, _ := json.Marshal(map[string]any{"workflow_name": "io.stepcollect.bench", "instance_id": uuid, "ids": ids,
			"commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation"}}})
		req, _ := http.NewRequest("POST", apiURL+"/v1/steps", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+benchAPIKey)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			b, _ := io.ReadAll(resp.Body)
			return fmt.Errorf("enqueue: %s %s", resp.Status, b)
		}
		return nil
	}
	if control {
		sem := make(chan struct{}, 16)
		errc := make(chan error, n)
		var wg sync.WaitGroup
		for i, id := range ids {
			wg.Add(1)
			sem <- struct{}{}
			go func() { defer wg.Done(); defer func() { <-sem }(); errc <- post([]string{id}, uuidOf(i)) }()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			if err != nil {
				return nil, err
			}
		}
	} else if err := post(ids, uuidOf(0)); err != nil {
		return nil, err
	}

	bodies := make([][]byte, n)
	for i, id := range ids {
		raw := base64.StdEncoding.EncodeToString(fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>CommandUUID</key><string>%s</string><key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string></dict></plist>`, uuidOf(i), id))
		bodies[i] = fmt.Appendf(nil, `{"topic":"mdm.Connect","event_id":"bench-%d","created_at":"2026-11-29T00:00:00Z","acknowledge_event":{"udid":%q,"status":"Acknowledged","command_uuid":%q,"raw_payload":%q}}`, i, id, uuidOf(i), raw)
	}

	res := &fanout.Result{Config: fanout.Config{Impl: implService, Mode: fanout.ModeFanOut, N: n, Control: control, Pool: cfg.Pool}, Errors: map[string]int{}, Server: cfg.Name}
	lat := make([]time.Duration, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, inflight)
	release := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			// from the release, as for every row: waiting for a slot is
			// part of a result's latency, as waiting for a pool connection is
			t0 := time.Now()
			sem <- struct{}{}
			defer func() { <-sem }()
			resp, err := client.Post(apiURL+"/webhook", "application/json", bytes.NewReader(bodies[i]))
			lat[i] = time.Since(t0)
			class := ""
			if err != nil {
				class = "http: no answer"
			} else {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					class = "http " + strconv.Itoa(resp.StatusCode)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if class != "" {
				res.Errors[class]++
			} else {
				res.Completed++
			}
		}()
	}
	pids := map[string]int{"api": api.cmd.Process.Pid, "worker": worker.cmd.Process.Pid, "load generator": os.Getpid()}
	if r.serverPID > 0 {
		pids["mysqld"] = r.serverPID
	}
	before := cpuTimes(pids)
	start := time.Now()
	close(release)
	wg.Wait()
	res.WallMS = fanout.MS(time.Since(start))
	res.P50MS, res.P99MS = fanout.Quantiles(lat)
	after := cpuTimes(pids)
	res.CPU = map[string]float64{}
	for name := range pids {
		res.CPU[name] = after[name] - before[name]
	}

	// wait for the worker to collect everything, then read its lag histogram
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var left int
		db.QueryRow(`SELECT COUNT(*) FROM steps`).Scan(&left)
		if left == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	db.QueryRowContext(context.Background(), `SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands), (SELECT COUNT(*) FROM step_commands)`).
		Scan(&res.Stranded.Steps, &res.Stranded.IDCommands, &res.Stranded.StepCommands)
	res.LagP50MS, res.LagP99MS, err = lagQuantiles(workerURL + "/metrics")
	if err != nil {
		return nil, err
	}
	done(res)
	return res, nil
}

// lagQuantiles reads stepcollect_collection_lag_seconds from a /metrics
// page and interpolates its median and 99th percentile as Prometheus's
// histogram_quantile does.
func lagQuantiles(url string) (p50, p99 float64, err error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	type bucket struct{ le, count float64 }
	var bs []bucket
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "stepcollect_collection_lag_seconds_bucket{") {
			continue
		}
		i, j := strings.Index(line, `le="`), strings.LastIndex(line, " ")
		leStr := line[i+4 : strings.Index(line[i+4:], `"`)+i+4]
		le, _ := strconv.ParseFloat(leStr, 64)
		if leStr == "+Inf" {
			le = math.Inf(1)
		}
		c, _ := strconv.ParseFloat(line[j+1:], 64)
		bs = append(bs, bucket{le, c})
	}
	sort.Slice(bs, func(a, b int) bool { return bs[a].le < bs[b].le })
	q := func(phi float64) float64 {
		if len(bs) == 0 || bs[len(bs)-1].count == 0 {
			return 0
		}
		rank := phi * bs[len(bs)-1].count
		prevLe, prevC := 0.0, 0.0
		for _, b := range bs {
			if b.count >= rank {
				if math.IsInf(b.le, 1) {
					return prevLe * 1000
				}
				return (prevLe + (b.le-prevLe)*(rank-prevC)/(b.count-prevC)) * 1000
			}
			prevLe, prevC = b.le, b.count
		}
		return prevLe * 1000
	}
	return q(0.5), q(0.99), nil
}

// cpuTimes reads each process's user+system CPU time, in ms, from /proc.
func cpuTimes(pids map[string]int) map[string]float64 {
	out := map[string]float64{}
	for name, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// fields after the parenthesised command name: utime and stime are
		// the 12th and 13th, in clock ticks of 10 ms
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) < 13 {
			continue
		}
		ut, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		out[name] = (ut + st) * 10
	}
	return out
}
