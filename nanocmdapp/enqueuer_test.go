package nanocmdapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/micromdm/nanocmd/engine"
	storageenginmem "github.com/micromdm/nanocmd/engine/storage/inmem"
	storageinvinmem "github.com/micromdm/nanocmd/subsystem/inventory/storage/inmem"
	"github.com/micromdm/nanocmd/utils/uuid"
	"github.com/micromdm/nanocmd/workflow/inventory"
	"github.com/micromdm/nanolib/log"
	"github.com/micromdm/plist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stepcollect/stepcollect/metrics"
)

// strictMDM is NanoMDM's enqueue API as strict as NanoMDM v0.9.0 is: a
// command UUID is stored once, a second request with it is refused (500,
// command_error) for every id; refuse names ids refused one by one (207);
// with push, every enqueue also answers the push_error NanoMDM answers
// without a push certificate (500, the command queued all the same).
type strictMDM struct {
	*httptest.Server
	mu      sync.Mutex
	queued  map[string][]string // id: command UUIDs queued for it
	seen    map[string]bool     // command UUIDs stored
	reqs    int
	maxPath int
	refuse  map[string]bool
	push    bool
}

func newStrictMDM(t *testing.T) *strictMDM {
	m := &strictMDM{queued: map[string][]string{}, seen: map[string]bool{}, refuse: map[string]bool{}}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var c struct{ CommandUUID string }
		if err := plist.Unmarshal(body, &c); err != nil || c.CommandUUID == "" {
			http.Error(w, `{"command_error":"decoding command: no command"}`, 500)
			return
		}
		ids := strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/enqueue/"), ",")
		m.mu.Lock()
		defer m.mu.Unlock()
		m.reqs++
		m.maxPath = max(m.maxPath, len(r.URL.RawPath), len(r.URL.Path))
		if m.seen[c.CommandUUID] {
			w.WriteHeader(500)
			fmt.Fprintf(w, `{"command_error":"Error 1062 (23000): Duplicate entry '%s' for key 'commands.PRIMARY'"}`, c.CommandUUID)
			return
		}
		m.seen[c.CommandUUID] = true
		status := map[string]string{}
		for _, id := range ids {
			if m.refuse[id] {
				status[id] = `{"command_error":"enrollment not found"}`
				continue
			}
			m.queued[id] = append(m.queued[id], c.CommandUUID)
			if m.push {
				status[id] = `{"push_error":"no push certificate"}`
			}
		}
		var parts []string
		for id, st := range status {
			parts = append(parts, fmt.Sprintf("%q:%s", id, st))
		}
		// NanoMDM's status: 200 with no error, 500 with every id's, 207 between
		code := 200
		switch {
		case len(status) == len(ids):
			code = 500
		case len(status) > 0:
			code = 207
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"status":{%s},"command_uuid":%q}`, strings.Join(parts, ","), c.CommandUUID)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *strictMDM) api(t *testing.T, maxURL int) (*mdmAPI, *metrics.MDM) {
	t.Helper()
	mm := metrics.NewMDM(prometheus.NewRegistry())
	a, err := newMDMAPI(m.URL+"/v1/enqueue/", m.URL+"/v1/push/", "key", false, maxURL, mm, log.NopLogger)
	if err != nil {
		t.Fatal(err)
	}
	return a, mm
}

func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
}

// A command's UUID goes to the MDM server in one request, whatever the
// count of ids, with its body: NanoCMD v0.7.1 split it into requests of 30
// (each after the first with an empty body), and NanoMDM refuses the UUID
// in every request after the first.
func TestAnEnqueueIsOneRequestWithTheCommand(t *testing.T) {
	t.Parallel()
	m := newStrictMDM(t)
	a, mm := m.api(t, DefaultMaxURLBytes)
	cmd := []byte(`<plist version="1.0"><dict><key>CommandUUID</key><string>U-1</string></dict></plist>`)
	if err := a.Enqueue(context.Background(), ids("ID", 70), cmd); err != nil {
		t.Fatal(err)
	}
	if m.reqs != 1 || len(m.queued) != 70 {
		t.Fatalf("%d requests queued the command for %d ids, want 1 for 70", m.reqs, len(m.queued))
	}
	if got := testutil.ToFloat64(mm.Enqueues.WithLabelValues(metrics.MDMEnqueueOK)); got != 70 {
		t.Errorf("mdm_enqueues_total{outcome=ok} = %v, want 70", got)
	}
	// the same UUID again is refused, named, for every id
	err := a.Enqueue(context.Background(), []string{"ID-x", "ID-y"}, cmd)
	var ee *EnqueueError
	if !errors.As(err, &ee) || len(ee.Failed) != 2 || !strings.Contains(err.Error(), "Duplicate entry 'U-1'") || !strings.Contains(err.Error(), "ID-x, ID-y") {
		t.Fatalf("a repeated command UUID: %v, want an EnqueueError naming ID-x and ID-y and NanoMDM's words", err)
	}
	if got := testutil.ToFloat64(mm.Enqueues.WithLabelValues(metrics.MDMEnqueueRefused)); got != 2 {
		t.Errorf("mdm_enqueues_total{outcome=refused} = %v, want 2", got)
	}
}

// NanoMDM answers 500 with a push_error when it queued the command but
// could not push (no push certificate): the enqueue succeeded; the push
// failure is counted. Ids refused one by one (207) are named alone; no
// answer at all fails every id.
func TestAnEnqueueReadsNanoMDMsAnswer(t *testing.T) {
	t.Parallel()
	m := newStrictMDM(t)
	m.push = true
	a, mm := m.api(t, DefaultMaxURLBytes)
	cmd := func(u string) []byte {
		return []byte(`<plist version="1.0"><dict><key>CommandUUID</key><string>` + u + `</string></dict></plist>`)
	}
	if err := a.Enqueue(context.Background(), []string{"A", "B"}, cmd("P-1")); err != nil {
		t.Fatalf("queued, push failed: %v, want nil", err)
	}
	if got := testutil.ToFloat64(mm.PushFailures); got != 2 {
		t.Errorf("mdm_push_failures_total = %v, want 2", got)
	}
	m.refuse["B"] = true
	err := a.Enqueue(context.Background(), []string{"A", "B", "C"}, cmd("P-2"))
	var ee *EnqueueError
	if !errors.As(err, &ee) || len(ee.Failed) != 1 || ee.Failed["B"] == "" || !strings.Contains(ee.Failed["B"], "enrollment not found") {
		t.Fatalf("B refused: %v, want an EnqueueError naming B alone with NanoMDM's words", err)
	}
	m.Close()
	err = a.Enqueue(context.Background(), []string{"A"}, cmd("P-3"))
	if !errors.As(err, &ee) || ee.Failed["A"] == "" {
		t.Fatalf("no answer: %v, want an EnqueueError naming A", err)
	}
	if got := testutil.ToFloat64(mm.Enqueues.WithLabelValues(metrics.MDMEnqueueError)); got != 1 {
		t.Errorf("mdm_enqueues_total{outcome=error} = %v, want 1", got)
	}
}

// Groups stay within the URL bound, ids escaped, none lost or repeated.
func TestGroupsFitTheURLBound(t *testing.T) {
	t.Parallel()
	m := newStrictMDM(t)
	a, _ := m.api(t, 600)
	all := append(ids("id/with?odd#chars", 200), "one more")
	groups := a.groups(all)
	var back []string
	for _, g := range groups {
		if n := len(idsURL(a.enqURL, g)); n > 600 && len(g) > 1 {
			t.Errorf("a group's URL is %d bytes, over 600", n)
		}
		back = append(back, g...)
	}
	if !slices.Equal(back, all) || len(groups) < 2 {
		t.Fatalf("%d groups gave back %d of %d ids in order", len(groups), len(back), len(all))
	}
	u, err := url.Parse(idsURL(a.enqURL, groups[0]))
	if err != nil || !strings.HasPrefix(u.Path, "/v1/enqueue/id/with?odd#chars-00000,") {
		t.Fatalf("escaped URL %v decodes to %q (%v)", u, u.Path, err)
	}
}

// startInventory starts the inventory workflow for n ids through the engine
// as cmd/nanocmd wires it (the splitter in front), on NanoCMD's in-memory
// storage, and returns the storage, the ids and the start's error.
func startInventory(t *testing.T, m *strictMDM, n, maxURL int) (*storageenginmem.InMem, []string, error) {
	t.Helper()
	a, _ := m.api(t, maxURL)
	st := storageenginmem.New()
	e := engine.New(st, a)
	steps := &splitSteps{engine: e, api: a, cancel: st.CancelSteps, wholeStep: true, ider: uuid.NewUUID(), logger: log.NopLogger}
	w, err := inventory.New(steps, storageinvinmem.New())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.RegisterWorkflow(w); err != nil {
		t.Fatal(err)
	}
	all := ids("DEVICE", n)
	_, err = e.StartWorkflow(context.Background(), inventory.WorkflowName, nil, all, nil, nil)
	return st, all, err
}

// One start for 3,000 or 10,000 ids reaches every id, each command UUID in
// one request: the step is split into steps whose ids fit a request.
func TestAStartReachesEveryID(t *testing.T) {
	t.Parallel()
	for _, n := range []int{3000, 10000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			m := newStrictMDM(t)
			st, all, err := startInventory(t, m, n, DefaultMaxURLBytes)
			if err != nil {
				t.Fatalf("start: %v", err)
			}
			for _, id := range all {
				if len(m.queued[id]) != 2 { // DeviceInformation and SecurityInfo
					t.Fatalf("%s was enqueued %d commands, want 2 (%d of %d ids reached)", id, len(m.queued[id]), len(m.queued), len(all))
				}
			}
			if m.maxPath > DefaultMaxURLBytes {
				t.Errorf("a request's path was %d bytes, over %d", m.maxPath, DefaultMaxURLBytes)
			}
			running, err := st.RetrieveOutstandingWorkflowStatus(context.Background(), inventory.WorkflowName, all)
			if err != nil || len(running) != len(all) {
				t.Fatalf("%d of %d ids outstanding (%v)", len(running), len(all), err)
			}
			t.Logf("%d ids: %d enqueue requests, longest path %d bytes", n, m.reqs, m.maxPath)
		})
	}
}

// Ids the MDM server refuses: the start answers an error naming them and
// NanoMDM's words; their steps are cancelled (nothing waits for a command
// that was never queued), the others run. NanoCMD's in-memory storage
// cancels a step whole, so a refused id's step-mates are cancelled and
// named with it; every id is either running or named.
func TestARefusedEnqueueCancelsItsIDsSteps(t *testing.T) {
	t.Parallel()
	m := newStrictMDM(t)
	m.refuse["DEVICE-00007"], m.refuse["DEVICE-00450"] = true, true
	st, all, err := startInventory(t, m, 500, 1000)
	var ee *EnqueueError
	if !errors.As(err, &ee) || !ee.Cancelled || ee.Of != 500 ||
		!strings.Contains(err.Error(), "DEVICE-00007, DEVICE-00450 (HTTP 207: enrollment not found)") {
		t.Fatalf("start: %v, want an error naming DEVICE-00007 and DEVICE-00450 with NanoMDM's words, of 500, cancelled", err)
	}
	running, err := st.RetrieveOutstandingWorkflowStatus(context.Background(), inventory.WorkflowName, all)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range all {
		_, named := ee.Failed[id]
		if slices.Contains(running, id) == named {
			t.Errorf("%s: running %v, named in the error %v: want exactly one", id, !named, named)
		}
	}
	if len(running) < 300 || len(ee.Failed) < 2 {
		t.Fatalf("%d running, %d named: want most running", len(running), len(ee.Failed))
	}
	t.Logf("%d running, %d named: %v", len(running), len(ee.Failed), err)
}
