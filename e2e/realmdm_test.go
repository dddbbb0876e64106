package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/events"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

// statusProxy passes NanoMDM's webhook posts on to target and counts the
// statuses they were answered with, as NanoMDM's log would show them.
type statusProxy struct {
	*httptest.Server
	mu     sync.Mutex
	status map[int]int
}

func newStatusProxy(t *testing.T, target string) *statusProxy {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &statusProxy{status: map[int]int{}}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ModifyResponse = func(r *http.Response) error {
		p.mu.Lock()
		p.status[r.StatusCode]++
		p.mu.Unlock()
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, err error) {
		p.mu.Lock()
		p.status[0]++
		p.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadGateway)
	}
	p.Server = httptest.NewServer(rp)
	t.Cleanup(p.Close)
	return p
}

// counts is how many posts were answered 2xx, and the other statuses.
func (p *statusProxy) counts() (ok int, other map[int]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	other = map[int]int{}
	for code, n := range p.status {
		if code/100 == 2 {
			ok += n
		} else {
			other[code] = n
		}
	}
	return ok, other
}

// deviceInformation is the command an engine sends, as a plist.
func deviceInformation(uuid string) []byte {
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>Command</key><dict><key>Queries</key><array><string>SerialNumber</string><string>UDID</string></array>`+
		`<key>RequestType</key><string>DeviceInformation</string></dict><key>CommandUUID</key><string>%s</string></dict></plist>`, uuid)
}

// The api and the worker as the README wires them behind NanoMDM v0.9.0's
// real server (its webhook at the api, the same HMAC key on both sides),
// 1,000 simulated Macs enrolled in NanoMDM with identity certificates, and a
// small engine in the test: it stores one step for all of them with POST
// /v1/steps, enqueues its command through NanoMDM's API in one request (one
// command UUID is stored once by NanoMDM), and takes the signed callbacks.
// Every device answers through NanoMDM, every webhook is answered 2xx, and
// the engine gets one step.completed per device carrying its own answer.
func TestTheStackBehindNanoMDMsRealServer(t *testing.T) {
	const callbackKey = "e2e-callback-key"
	n := testkit.EnvInt("STEPCOLLECT_E2E_REALMDM_N", 1000)
	db, rs := testkit.NewDB(t, nil), testkit.StartRedis(t)
	s := testkit.StartStack(t, testkit.StackConfig{
		DSN: db.DSN, RedisURL: rs.URL, DB: db.DB, APIKey: apiKey,
		Env:        []string{"STEPCOLLECT_LOG_LEVEL=warn"},
		APIEnv:     []string{"STEPCOLLECT_WEBHOOK_HMAC_KEY=" + hmacKey},
		Receiver:   &testkit.ReceiverOptions{HMACKey: []byte(callbackKey), CompletionsOnly: true},
		WorkerArgs: []string{"-callback-hmac-key", callbackKey},
	})
	hook := newStatusProxy(t, s.APIURL)
	mdm := nanomdm.Start(t, nanomdm.Options{WebhookURL: hook.URL + "/webhook", HMACKey: hmacKey})
	fleet, err := mdmsim.NewFleet(mdm.CA, mdmsim.Target{MDMURL: mdm.MDMURL, CertHeader: mdm.CertHeader},
		mdmsim.FleetConfig{N: n, UDIDPrefix: "REALMDM", PollEvery: 2 * time.Second, Logf: t.Logf, LogEvery: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := fleet.Enroll(ctx); err != nil {
		t.Fatalf("enrolling %d devices: %v\n%s", n, err, mdm.Logs())
	}
	ids := fleet.IDs()

	// the engine: the step first, then the command
	const uuid = "REALMDM-DEVINFO"
	cmd := deviceInformation(uuid)
	stepID := s.Client.MustEnqueue(t, map[string]any{
		"workflow_name": "io.example.inventory", "instance_id": "run-1", "step_name": "query", "ids": ids,
		"commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation", "command": base64.StdEncoding.EncodeToString(cmd)}},
	})
	start := time.Now()
	r, err := mdm.EnqueueNoPush(ctx, cmd, ids...)
	if err != nil || r.HTTPStatus != http.StatusOK || r.EnqueueError != nil || len(r.Status) > 0 {
		t.Fatalf("enqueue to %d ids through NanoMDM: %v: %d %s", n, err, r.HTTPStatus, r.Body)
	}
	go fleet.Run(ctx)
	defer fleet.Stop()
	fleet.Wake()

	testkit.WaitUntil(t, 4*time.Minute, fmt.Sprintf("a step.completed for each of %d devices at the engine", n), func() (bool, any) {
		_, distinct, _ := s.Rcv.Completions()
		return distinct == n, fmt.Sprintf("%d completions; devices %v", distinct, fleet.Progress())
	})
	t.Logf("%d devices: every step.completed at the engine %v after the enqueue", n, time.Since(start).Round(time.Millisecond))
	for _, v := range s.Rcv.Violations() {
		t.Error(v)
	}
	for _, ev := range s.Rcv.Events() {
		id := ev.Step.IDs[0]
		if ev.Type != events.StepCompleted || ev.Step.StepID != stepID || len(ev.Step.Commands) != 1 ||
			!strings.Contains(string(ev.Step.Commands[0].Result), id) {
			t.Fatalf("%s: event %s for step %d, want its own step.completed of step %d with its answer", id, ev.Type, ev.Step.StepID, stepID)
		}
	}
	ok, other := hook.counts()
	if len(other) > 0 || ok < n {
		t.Errorf("NanoMDM's webhook posts: %d answered 2xx, others %v; want every one 2xx, at least %d", ok, other, n)
	}
	t.Logf("NanoMDM posted %d webhooks, all 2xx", ok)
	testkit.WaitUntil(t, 30*time.Second, "the step collected", func() (bool, any) {
		status, _ := s.Client.V1(t, "GET", fmt.Sprintf("/v1/steps/%d", stepID), nil)
		return status == http.StatusNotFound, status
	})
	s.Stop(t)
}
