// Package pace drives the built binaries (without the race detector, at
// full speed) the way a busy NanoCMD deployment does, to prove that the
// worker pool keeps pace: with the sweeper off, every step is collected and
// every event delivered, in every round, and none strands.
package pace

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

var bins map[string]string

// TestMain builds the binaries, or uses those in STEPCOLLECT_PACE_BINDIR
// (to run this test against another build, such as an older commit's).
func TestMain(m *testing.M) {
	testkit.Main(m, "STEPCOLLECT_PACE_BINDIR", false, func(b map[string]string) { bins = b }, "cmd/api", "cmd/worker")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

const apiKey = "pace-api-key"

// receiver is the workflow engine's callback endpoint: it counts distinct
// step.completed events.
type receiver struct {
	mu   sync.Mutex
	seen map[string]bool
	dups int
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var ev struct {
		EventID string `json:"event_id"`
		Type    string `json:"type"`
	}
	if err := json.NewDecoder(req.Body).Decode(&ev); err != nil || ev.EventID == "" {
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	if r.seen[ev.EventID] {
		r.dups++
	}
	r.seen[ev.EventID] = true
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// waitUntil polls cond every 20 ms and reports how long it took, failing
// the test after within.
func waitUntil(t *testing.T, within time.Duration, what func() string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not within %v: %s", within, what())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start)
}

// NanoCMD's most common shape, a step of its own for each enrollment
// (per-device workflows), answered through the webhook as fast as the api
// takes them, with the sweeper off and the scheduler claiming steps rows
// every second: every step must be collected and every step.completed
// delivered within seconds of the round's last 200, in every round. A
// skipped SKIP LOCKED claim that was taken for a collection, or a
// deduplicated hand-off, strands steps here.
//
// STEPCOLLECT_PACE_ROUNDS and STEPCOLLECT_PACE_N size it (default 20
// rounds of 3000).
func TestNoStepStrandsWithTheSweeperOff(t *testing.T) {
	rounds, n := envInt("STEPCOLLECT_PACE_ROUNDS", 20), envInt("STEPCOLLECT_PACE_N", 3000)
	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	rcv := &receiver{seen: map[string]bool{}}
	callback := httptest.NewServer(rcv)
	t.Cleanup(callback.Close)

	apiAddr, workerAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	env := []string{"STEPCOLLECT_MYSQL_DSN=" + db.DSN, "STEPCOLLECT_REDIS_URL=" + rs.URL, "STEPCOLLECT_LOG_LEVEL=warn"}
	worker := testkit.StartProc(t, bins["worker"], env, "-metrics-listen", workerAddr,
		"-sweep-interval", "0", "-schedule-interval", "1s", "-callback-url", callback.URL)
	testkit.AwaitHTTP(t, worker, "http://"+workerAddr+"/readyz", 30*time.Second)
	api := testkit.StartProc(t, bins["api"], append(env, "STEPCOLLECT_API_KEY="+apiKey), "-listen", apiAddr)
	apiURL := "http://" + apiAddr
	testkit.AwaitHTTP(t, api, apiURL+"/readyz", 30*time.Second)

	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	post := func(path string, body []byte, header map[string]string) (int, error) {
		req, _ := http.NewRequest("POST", apiURL+path, bytes.NewReader(body))
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// parallel runs f(i) for i in [0,n) with width at once, failing on the
	// first error.
	parallel := func(width int, f func(i int) error) {
		var wg sync.WaitGroup
		sem := make(chan struct{}, width)
		errc := make(chan error, 1)
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				if err := f(i); err != nil {
					select {
					case errc <- err:
					default:
					}
				}
			}()
		}
		wg.Wait()
		select {
		case err := <-errc:
			t.Fatal(err)
		default:
		}
	}
	countSteps := func() (steps, rows int) {
		if err := db.QueryRow(`SELECT (SELECT COUNT(*) FROM steps), (SELECT COUNT(*) FROM id_commands)`).Scan(&steps, &rows); err != nil {
			t.Fatal(err)
		}
		return steps, rows
	}

	delivered := 0
	for round := range rounds {
		id := func(i int) string { return fmt.Sprintf("R%02d-E%05d", round, i) }
		uuid := func(i int) string { return fmt.Sprintf("R%02d-C%05d", round, i) }
		parallel(16, func(i int) error {
			body, _ := json.Marshal(map[string]any{"workflow_name": "io.example.pace", "instance_id": uuid(i),
				"ids": []string{id(i)}, "commands": []map[string]string{{"command_uuid": uuid(i), "request_type": "DeviceInformation"}}})
			if status, err := post("/v1/steps", body, map[string]string{"Authorization": "Bearer " + apiKey}); err != nil || status != http.StatusCreated {
				return fmt.Errorf("round %d: enqueue %d: %d %v", round, i, status, err)
			}
			return nil
		})
		start := time.Now()
		parallel(64, func(i int) error {
			raw := fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?><plist version="1.0"><dict><key>CommandUUID</key><string>%s</string><key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string></dict></plist>`, uuid(i), id(i))
			body := fmt.Appendf(nil, `{"topic":"mdm.Connect","event_id":"e%d","acknowledge_event":{"udid":%q,"command_uuid":%q,"raw_payload":%q}}`,
				i, id(i), uuid(i), base64.StdEncoding.EncodeToString(raw))
			if status, err := post("/webhook", body, nil); err != nil || status != http.StatusOK {
				return fmt.Errorf("round %d: webhook %d: %d %v", round, i, status, err)
			}
			return nil
		})
		answered := time.Since(start)
		collected := waitUntil(t, 15*time.Second, func() string {
			s, r := countSteps()
			return fmt.Sprintf("round %d: %d steps (%d id_commands rows) left uncollected with the sweeper off", round, s, r)
		}, func() bool { s, _ := countSteps(); return s == 0 })
		delivered += n
		events := waitUntil(t, 15*time.Second, func() string {
			return fmt.Sprintf("round %d: %d of %d events delivered", round, rcv.count(), delivered)
		}, func() bool { return rcv.count() == delivered })
		t.Logf("round %2d: %d results answered in %v (%.0f/s); steps collected %v and events delivered %v after the last 200",
			round, n, answered.Round(time.Millisecond), float64(n)/answered.Seconds(), collected.Round(time.Millisecond), events.Round(time.Millisecond))
	}
	if steps, rows := countSteps(); steps != 0 || rows != 0 {
		t.Errorf("%d steps and %d id_commands rows left", steps, rows)
	}
	if err := api.Stop(); err != nil {
		t.Errorf("api on SIGTERM: %v", err)
	}
	if err := worker.Stop(); err != nil {
		t.Errorf("worker on SIGTERM: %v", err)
	}
}
