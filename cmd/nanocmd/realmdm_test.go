package main_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

// realStack is NanoMDM v0.9.0's own server, the binary's replicas on one
// database enqueuing through NanoMDM's API, NanoMDM's webhook posted to
// them through a proxy that counts their answers, and simulated Macs
// enrolled in NanoMDM. Its tests run one at a time: two stacks' pools
// under a burst of webhooks took a shared MariaDB's 151 connections
// (Error 1040, a webhook answered 500).
type realStack struct {
	*cluster
	nano *nanomdm.Server
	hook *hookRecorder
}

// startRealStack starts NanoMDM and n replicas with NanoCMD's engine
// worker every second. NanoMDM keeps its own data in memory on MariaDB,
// where its MySQL storage does not run, and in a MySQL database of its own
// on MySQL (make test-mysql).
func startRealStack(t *testing.T, n int) *realStack {
	t.Helper()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	hook := newHookRecorder(t)
	opts := nanomdm.Options{WebhookURL: hook.URL + "/webhook", HMACKey: hmacKey}
	if !isMariaDB(t, db) {
		opts.Storage, opts.DSN = "mysql", nanomdm.NewMySQLDB(t).DSN
	}
	srv := nanomdm.Start(t, opts)
	c := startReplicas(t, db, srv.URL, srv.APIKey, n, "-worker-interval", "1")
	hook.forwardTo(c.base)
	t.Logf("nanomdm %s\nnanocmd %s", strings.Join(srv.Proc.Cmd.Args[1:], " "), strings.Join(c.args[0], " "))
	return &realStack{cluster: c, nano: srv, hook: hook}
}

// macs enrolls cfg.N Macs in NanoMDM (polling every second unless cfg
// says otherwise, once they run), and waits until the binary has had their
// check-ins.
func (s *realStack) macs(t *testing.T, cfg mdmsim.FleetConfig) *mdmsim.Fleet {
	t.Helper()
	cfg.PollEvery = cmp.Or(cfg.PollEvery, time.Second)
	f, err := mdmsim.NewFleet(s.nano.CA, mdmsim.Target{MDMURL: s.nano.MDMURL, CertHeader: s.nano.CertHeader}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := f.Enroll(ctx); err != nil {
		t.Fatalf("enrolling %d Macs: %v\n%s", cfg.N, err, s.nano.Logs())
	}
	s.hook.awaitEnrolled(t, 1, f.IDs()...)
	return f
}

// run has f's Macs poll until t ends, and fails t then if a poll failed.
func run(t *testing.T, f *mdmsim.Fleet) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		if errs := f.Errors(); len(errs) > 0 || f.Progress().Failures > 0 {
			t.Errorf("polls failed (%v): %v", f.Progress(), errs)
		}
	})
}

// startOn starts workflow name for f's Macs and wakes them, as NanoMDM's
// push would (it has no push certificate).
func (s *realStack) startOn(t *testing.T, f *mdmsim.Fleet, name, wfCtx string) {
	t.Helper()
	s.startFor(t, name, wfCtx, f.IDs()...)
	f.Wake()
}

// answered is the request types d gave a final answer (not NotNow), in
// order.
func answered(d *mdmsim.Device) []string {
	var out []string
	for _, e := range d.Exchanges() {
		if e.MessageType == "" && e.Status != "NotNow" {
			out = append(out, e.RequestType)
		}
	}
	return out
}

// statusesOf are d's answers to its commands of requestType, in order.
func statusesOf(d *mdmsim.Device, requestType string) []string {
	var out []string
	for _, e := range d.Exchanges() {
		if e.RequestType == requestType {
			out = append(out, e.Status)
		}
	}
	return out
}

// awaitAnswered waits until d has answered the request types of each of
// steps, step after step, and nothing else. Within a step the order is
// NanoMDM's: its MySQL queue orders commands by a TIMESTAMP, to the
// second, so that a step's commands come in any order.
func awaitAnswered(t *testing.T, d *mdmsim.Device, steps ...[]string) {
	t.Helper()
	testkit.WaitUntil(t, 30*time.Second, fmt.Sprintf("%s answering %v", d.UDID, steps), func() (bool, any) {
		got := answered(d)
		rest := got
		for _, step := range steps {
			if len(rest) < len(step) || !slices.Equal(slices.Sorted(slices.Values(rest[:len(step)])), slices.Sorted(slices.Values(step))) {
				return false, got
			}
			rest = rest[len(step):]
		}
		return len(rest) == 0, got
	})
}

// steps are request types, a step each.
func steps(requestTypes ...string) [][]string {
	out := make([][]string, len(requestTypes))
	for i, r := range requestTypes {
		out[i] = []string{r}
	}
	return out
}

// awaitInventory waits until the inventory route has every one of keys for
// id and returns id's values.
func (s *realStack) awaitInventory(t *testing.T, id string, keys ...string) map[string]any {
	t.Helper()
	var inv map[string]any
	testkit.WaitUntil(t, 30*time.Second, id+"'s "+strings.Join(keys, ", ")+" in the inventory", func() (bool, any) {
		inv = s.inventory(t, id)
		for _, k := range keys {
			if inv[k] == nil {
				return false, inv
			}
		}
		return true, inv
	})
	return inv
}

// awaitNoCommands waits until no step waits for a command of id.
func (s *realStack) awaitNoCommands(t *testing.T, id string) {
	t.Helper()
	testkit.WaitUntil(t, 30*time.Second, "no command of "+id+" waited for", func() (bool, any) {
		n := testkit.Count(t, s.db.DB, "SELECT COUNT(*) FROM id_commands WHERE enrollment_id = ?", id)
		return n == 0, n
	})
}

// noFailedWebhook fails t if the binary answered a webhook with anything
// but a 2xx, or NanoMDM logged a failed webhook (its services after the
// first log their errors with the key sub_service).
func (s *realStack) noFailedWebhook(t *testing.T) {
	t.Helper()
	counts, failed := s.hook.answers()
	for code := range counts {
		if code/100 != 2 {
			t.Errorf("webhook answers by status %v; the first non-2xx: %q", counts, failed)
			break
		}
	}
	for line := range strings.Lines(s.nano.Logs()) {
		if strings.Contains(line, "sub_service") {
			t.Errorf("NanoMDM logged a failed webhook: %s", line)
			break
		}
	}
}

// hookRecorder is NanoMDM's -webhook-url: a reverse proxy to the binary
// that counts its answers by status, and notes the check-ins it answered.
type hookRecorder struct {
	URL    string
	target atomic.Pointer[url.URL]

	mu       sync.Mutex
	counts   map[int]int
	failed   []string       // the first few non-2xx answers
	checkins map[string]int // "topic UDID": check-ins answered 2xx
}

// checkin is what the recorder reads of a webhook post.
type checkin struct {
	Topic        string                 `json:"topic"`
	CheckinEvent *struct{ UDID string } `json:"checkin_event"`
}

func newHookRecorder(t *testing.T) *hookRecorder {
	h := &hookRecorder{counts: map[int]int{}, checkins: map[string]int{}}
	proxy := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(h.target.Load()) },
		// NanoMDM posts each event on its own goroutine: many at once
		Transport: &http.Transport{MaxIdleConns: 128, MaxIdleConnsPerHost: 128, IdleConnTimeout: time.Minute},
		ModifyResponse: func(resp *http.Response) error {
			var body []byte
			if resp.StatusCode/100 != 2 {
				body, _ = io.ReadAll(resp.Body)
				resp.Body = io.NopCloser(bytes.NewReader(body))
			}
			h.record(resp.StatusCode, body)
			if resp.StatusCode/100 == 2 {
				h.answered(resp.Request)
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			h.record(http.StatusBadGateway, []byte(err.Error()))
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h.target.Load() == nil {
			h.record(http.StatusServiceUnavailable, []byte("posted before the binary started"))
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		// the post is read here and handed on, for answered to decode
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		proxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), postKey{}, body)))
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL
	return h
}

type postKey struct{}

// answered notes the check-in of the post r carried, if it was one.
func (h *hookRecorder) answered(r *http.Request) {
	body, _ := r.Context().Value(postKey{}).([]byte)
	var c checkin
	if json.Unmarshal(body, &c) != nil || c.CheckinEvent == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checkins[c.Topic+" "+c.CheckinEvent.UDID]++
}

// awaitEnrolled waits until the binary answered the Authenticate and the
// TokenUpdate of each id, times times: NanoMDM posts each event on a
// goroutine of its own, so that an Authenticate posted late would cancel
// a workflow started after the enrollment. A webhook answered non-2xx
// fails t at once.
func (h *hookRecorder) awaitEnrolled(t *testing.T, times int, ids ...string) {
	t.Helper()
	var failed []string
	testkit.WaitUntil(t, 2*time.Minute, fmt.Sprintf("the check-ins of %d Macs answered", len(ids)), func() (bool, any) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if failed = slices.Clone(h.failed); len(failed) > 0 {
			return true, nil
		}
		for _, id := range ids {
			if h.checkins["mdm.Authenticate "+id] < times || h.checkins["mdm.TokenUpdate "+id] < times {
				return false, id + " not yet"
			}
		}
		return true, nil
	})
	if len(failed) > 0 {
		t.Fatalf("webhooks answered non-2xx: %q", failed)
	}
}

func (h *hookRecorder) forwardTo(base string) {
	u, err := url.Parse(base)
	if err != nil {
		panic(err)
	}
	h.target.Store(u)
}

func (h *hookRecorder) record(code int, body []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[code]++
	if code/100 != 2 && len(h.failed) < 3 {
		h.failed = append(h.failed, fmt.Sprintf("%d %s", code, bytes.TrimSpace(body)))
	}
}

// answers are the binary's answers so far by status, and the first few
// that were not 2xx.
func (h *hookRecorder) answers() (map[int]int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	counts := make(map[int]int, len(h.counts))
	for code, n := range h.counts {
		counts[code] = n
	}
	return counts, slices.Clone(h.failed)
}

// scepProfile is a profile with a SCEP payload whose subject's CN is %CN%
// (certprof's text replacement sets it); a device gets an identity of
// that name from it.
func scepProfile() []byte {
	return []byte(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
<key>PayloadIdentifier</key><string>com.example.scep</string><key>PayloadUUID</key><string>SCEP-UUID-1</string>
<key>PayloadType</key><string>Configuration</string><key>PayloadVersion</key><integer>1</integer>
<key>PayloadDisplayName</key><string>SCEP %CN%</string>
<key>PayloadContent</key><array><dict>
<key>PayloadType</key><string>com.apple.security.scep</string><key>PayloadVersion</key><integer>1</integer>
<key>PayloadIdentifier</key><string>com.example.scep.payload</string><key>PayloadUUID</key><string>SCEP-PAYLOAD-1</string>
<key>PayloadContent</key><dict><key>URL</key><string>https://scep.example.com/scep</string>
<key>Subject</key><array><array><array><string>CN</string><string>%CN%</string></array></array></array></dict>
</dict></array></dict></plist>`)
}

// Every workflow of NanoCMD v0.7.1 through NanoMDM's own server, on Macs
// that enroll in it and poll it: NanoMDM posts their check-ins and answers
// to the binary, which enqueues each step's commands through NanoMDM's API.
// Each workflow is checked by its effect on the Macs and in the inventory;
// an Error answer is stored and its webhook answered 200, a NotNow is
// followed by the answer, an Authenticate cancels the enrollment's steps,
// and an event subscription starts a workflow on enrollment. No webhook
// failed, and no step row is left.
func TestEveryWorkflowThroughNanoMDMsOwnServer(t *testing.T) {
	s := startRealStack(t, 1)
	everyWorkflowThroughNanoMDM(t, s)
}

// The same on two replicas on one database behind one URL, NanoMDM's
// webhook and the API each request to the next replica.
func TestEveryWorkflowThroughNanoMDMOnTwoReplicasBehindOneURL(t *testing.T) {
	s := startRealStack(t, 2)
	everyWorkflowThroughNanoMDM(t, s)
	for i, p := range s.procs {
		if !strings.Contains(p.Logs(), "path=/webhook") {
			t.Errorf("replica %d had no webhook: the proxy did not spread the requests", i)
		}
	}
}

func everyWorkflowThroughNanoMDM(t *testing.T, s *realStack) {
	s.mustCall(t, "PUT", "/v1/profile/wifi", mobileconfig("com.example.wifi", "WIFI-UUID-1", "Wi-Fi"))

	t.Run("inventory", func(t *testing.T) {
		f := s.macs(t, mdmsim.FleetConfig{N: 3, UDIDPrefix: "INV-"})
		run(t, f)
		s.startOn(t, f, wfInventory, "")
		for _, d := range f.Devices() {
			awaitAnswered(t, d, []string{"DeviceInformation", "SecurityInfo"})
			inv := s.awaitInventory(t, d.UDID, "serial_number", "sip_enabled")
			if inv["serial_number"] != d.Serial || inv["model"] != "Mac14,2" || inv["os_version"] != "14.4.1" ||
				inv["apple_silicon"] != true || inv["sip_enabled"] != true || inv["fde_enabled"] != false {
				t.Errorf("%s: inventory %v, want serial number %s, Mac14,2, 14.4.1, Apple silicon, SIP on, FileVault off", d.UDID, inv, d.Serial)
			}
		}
	})

	t.Run("profile", func(t *testing.T) {
		f := s.macs(t, mdmsim.FleetConfig{N: 2, UDIDPrefix: "PROF-"})
		run(t, f)
		a, b := f.Devices()[0], f.Devices()[1]
		s.startOn(t, f, wfProfile, "wifi")
		for _, d := range f.Devices() {
			awaitAnswered(t, d, steps("ProfileList", "InstallProfile")...)
			s.awaitNoCommands(t, d.UDID) // before the next start, or it is refused as running
			if got := d.Installed().Profiles; !slices.Equal(got, []string{"com.example.wifi"}) {
				t.Errorf("%s has profiles %v, want com.example.wifi", d.UDID, got)
			}
		}
		// installed with the same UUID: listed, not installed again; and
		// "-name" removes it where installed
		s.startFor(t, wfProfile, "wifi", b.UDID)
		s.startFor(t, wfProfile, "-wifi", a.UDID)
		f.Wake()
		awaitAnswered(t, a, steps("ProfileList", "InstallProfile", "ProfileList", "RemoveProfile")...)
		s.awaitNoCommands(t, a.UDID)
		s.awaitNoCommands(t, b.UDID)
		if got := answered(b); !slices.Equal(got, []string{"ProfileList", "InstallProfile", "ProfileList"}) {
			t.Errorf("%s, already installed, answered %v, want the profile listed, not installed again", b.UDID, got)
		}
		if got := a.Installed().Profiles; len(got) != 0 {
			t.Errorf("%s still has %v", a.UDID, got)
		}
	})

	t.Run("lock", func(t *testing.T) {
		f := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "LOCK-"})
		run(t, f)
		d := f.Devices()[0]
		s.startOn(t, f, wfLock, "")
		inv := s.awaitInventory(t, d.UDID, wfLock+".received")
		if pin := d.Installed().LockPIN; len(pin) != 6 || inv[wfLock+".pin"] != pin {
			t.Errorf("%s was locked with PIN %q; the inventory escrowed %v", d.UDID, pin, inv[wfLock+".pin"])
		}
	})

	t.Run("certprof", func(t *testing.T) {
		s.mustCall(t, "PUT", "/v1/profile/scep", scepProfile())
		f := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "CERT-"})
		run(t, f)
		d := f.Devices()[0]
		wfCtx := fmt.Sprintf(`{"profile":"scep","filter":{"cn_prefix":"device-"},"criteria":{"until_expiry_seconds":2592000},"text_replacements":{"%%CN%%":"device-%s"}}`, d.UDID)
		s.startOn(t, f, wfCertProf, wfCtx)
		awaitAnswered(t, d, steps("CertificateList", "InstallProfile")...)
		s.awaitNoCommands(t, d.UDID)
		if got := d.Installed().Profiles; !slices.Equal(got, []string{"com.example.scep"}) {
			t.Errorf("%s has profiles %v, want com.example.scep", d.UDID, got)
		}
		// the identity the profile gave is listed, and has a year to run
		s.startOn(t, f, wfCertProf, wfCtx)
		awaitAnswered(t, d, steps("CertificateList", "InstallProfile", "CertificateList")...)
		s.awaitNoCommands(t, d.UDID)
		if got := answered(d); len(got) != 3 {
			t.Errorf("%s answered %v, want the identity kept", d.UDID, got)
		}
	})

	t.Run("device-info log", func(t *testing.T) {
		f := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "DEVINFO-"})
		run(t, f)
		d := f.Devices()[0]
		s.startOn(t, f, wfDevInfoLog, "")
		testkit.WaitUntil(t, 30*time.Second, "the device information logged", func() (bool, any) {
			return strings.Contains(s.logs(), fmt.Sprintf("UDID=%s, SerialNumber=%s, Model=Mac14,2", d.UDID, d.Serial)), answered(d)
		})
	})

	t.Run("fvenable then fvrotate", func(t *testing.T) {
		// FileVault comes on at the second SecurityInfo after the profile
		f := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "FV-", Behavior: func(int) mdmsim.Behavior { return mdmsim.Behavior{FileVaultDelay: 1} }})
		run(t, f)
		d := f.Devices()[0]
		s.startOn(t, f, wfFVEnable, "")
		awaitAnswered(t, d, steps("InstallProfile")...)
		// fvenable asks for SecurityInfo every two minutes until FileVault
		// is on and its key escrowed: each of those steps' NotUntil is
		// moved past
		var prk string
		testkit.WaitUntil(t, time.Minute, "the FileVault key escrowed", func() (bool, any) {
			s.passNotUntil(t)
			f.Wake()
			prk = d.Installed().RecoveryKey
			inv := s.inventory(t, d.UDID)
			return prk != "" && inv["prk"] == prk, answered(d)
		})
		if got := answered(d); !slices.Equal(got, []string{"InstallProfile", "SecurityInfo", "SecurityInfo"}) {
			t.Errorf("%s answered %v, want the profile, then SecurityInfo until FileVault was on", d.UDID, got)
		}

		s.awaitNoCommands(t, d.UDID)
		s.startOn(t, f, wfFVRotate, "")
		testkit.WaitUntil(t, 30*time.Second, "the rotated key escrowed", func() (bool, any) {
			now := d.Installed().RecoveryKey
			inv := s.inventory(t, d.UDID)
			return now != prk && inv["prk"] == now, statusesOf(d, "RotateFileVaultKey")
		})
		if got := statusesOf(d, "RotateFileVaultKey"); !slices.Equal(got, []string{"Acknowledged"}) {
			t.Errorf("%s answered RotateFileVaultKey %v, want Acknowledged (the escrowed key unlocked it)", d.UDID, got)
		}
	})

	t.Run("NotNow, then the answer", func(t *testing.T) {
		// the step's last command: NanoMDM's key-value queue loses a
		// command answered NotNow once the one after it is answered
		// (testkit/nanomdm, TestANotNowCommandIsLostWhenTheNextIsAnswered)
		f := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "NOTNOW-", Behavior: func(int) mdmsim.Behavior {
			return mdmsim.Behavior{NotNow: map[string]int{"SecurityInfo": 2}}
		}})
		run(t, f)
		d := f.Devices()[0]
		s.startOn(t, f, wfInventory, "")
		if inv := s.awaitInventory(t, d.UDID, "serial_number", "sip_enabled"); inv["serial_number"] != d.Serial {
			t.Errorf("%s: inventory %v, want serial number %s", d.UDID, inv, d.Serial)
		}
		if got := statusesOf(d, "SecurityInfo"); !slices.Equal(got, []string{"NotNow", "NotNow", "Acknowledged"}) {
			t.Errorf("%s answered SecurityInfo %v, want NotNow twice, then Acknowledged", d.UDID, got)
		}
	})

	t.Run("an Error answer is stored and its webhook answered 200", func(t *testing.T) {
		f := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "ERROR-", Behavior: func(int) mdmsim.Behavior {
			return mdmsim.Behavior{Errors: []string{"DeviceInformation"}}
		}})
		run(t, f)
		d := f.Devices()[0]
		s.startOn(t, f, wfInventory, "")
		awaitAnswered(t, d, []string{"DeviceInformation", "SecurityInfo"})
		s.awaitNoCommands(t, d.UDID)
		testkit.WaitUntil(t, 10*time.Second, "the workflow's failure logged", func() (bool, any) {
			for line := range strings.Lines(s.logs()) {
				if strings.Contains(line, "its workflow failed on the completed step") && strings.Contains(line, d.UDID) {
					return true, nil
				}
			}
			return false, statusesOf(d, "DeviceInformation")
		})
		s.noFailedWebhook(t)
	})

	t.Run("Authenticate again cancels the enrollment's steps", func(t *testing.T) {
		// not run: it polls when told
		f := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "AUTH-", Behavior: func(int) mdmsim.Behavior {
			return mdmsim.Behavior{ReauthenticateAfter: 1}
		}})
		d := f.Devices()[0]
		poll := func(want int) {
			t.Helper()
			if n, err := d.Poll(context.Background()); n != want || err != nil {
				t.Fatalf("%s answered %d commands (%v), want %d", d.UDID, n, err, want)
			}
		}
		s.startFor(t, wfDevInfoLog, "", d.UDID)
		poll(1)
		s.awaitNoCommands(t, d.UDID)
		s.startFor(t, wfLock, "", d.UDID)
		if inv := s.inventory(t, d.UDID); inv[wfLock+".pin"] == nil {
			t.Fatalf("no PIN escrowed at the lock's start: %v", inv)
		}
		// it authenticates first: NanoMDM clears its queue, the binary
		// cancels its steps
		poll(0)
		s.hook.awaitEnrolled(t, 2, d.UDID)
		s.awaitNoCommands(t, d.UDID)
		if inv := s.inventory(t, d.UDID); inv[wfLock+".received"] != nil || d.Installed().LockPIN != "" {
			t.Errorf("a lock cancelled by Authenticate was completed: %v", inv)
		}
		// not outstanding any more: started again, it runs
		s.startFor(t, wfLock, "", d.UDID)
		poll(1)
		s.awaitInventory(t, d.UDID, wfLock+".received")
	})

	// last: the subscription starts the workflow at every enrollment after
	t.Run("cmdplan by API and on enrollment", func(t *testing.T) {
		s.mustCall(t, "PUT", "/v1/cmdplan/setup", []byte(`{"profile_names":["wifi"],"manifest_urls":["https://example.com/app.plist"],"device_configured":true}`))
		byAPI := s.macs(t, mdmsim.FleetConfig{N: 1, UDIDPrefix: "PLAN-API-"})
		run(t, byAPI)
		s.mustCall(t, "PUT", "/v1/event/enroll-setup", fmt.Appendf(nil, `{"event":"Enrollment","workflow":%q,"context":"setup"}`, wfCMDPlan))
		enrolled := s.macs(t, mdmsim.FleetConfig{N: 2, UDIDPrefix: "PLAN-DEP-", Behavior: func(int) mdmsim.Behavior {
			return mdmsim.Behavior{AwaitingConfiguration: true}
		}})
		run(t, enrolled)
		s.startOn(t, byAPI, wfCMDPlan, "setup")
		// DeviceConfigured only for an enrollment awaiting configuration
		awaitAnswered(t, byAPI.Devices()[0], []string{"InstallProfile", "InstallApplication"})
		for _, d := range enrolled.Devices() {
			awaitAnswered(t, d, []string{"InstallProfile", "InstallApplication", "DeviceConfigured"})
		}
		for _, d := range append(byAPI.Devices(), enrolled.Devices()...) {
			in := d.Installed()
			if !slices.Equal(in.Profiles, []string{"com.example.wifi"}) || !slices.Equal(in.Apps, []string{"app"}) || in.AwaitingConfiguration {
				t.Errorf("%s: %+v, want the plan's profile and app, and configured", d.UDID, in)
			}
		}
	})

	s.noCommandsLeft(t)
	s.noStepRowsLeft(t)
	s.noFailedWebhook(t)
}

// noCommandsLeft waits until no step waits for a command, naming those
// that do.
func (s *realStack) noCommandsLeft(t *testing.T) {
	t.Helper()
	testkit.WaitUntil(t, 15*time.Second, "no command waited for", func() (bool, any) {
		left := testkit.Column[string](t, s.db.DB, `SELECT CONCAT(enrollment_id, ' ', request_type, ' completed=', completed, ' step=', step_id) FROM id_commands`)
		return len(left) == 0, left
	})
}

// One start of the inventory workflow for 3,000 Macs enrolled in NanoMDM
// (STEPCOLLECT_E2E_MACS sizes it) reaches every one of them: each answers
// both commands once, each has its values in the inventory route, every
// webhook is answered 2xx, and no step row is left. NanoCMD v0.7.1's
// enqueuer sent one command UUID in requests of 30 ids, and NanoMDM took
// only the first.
func TestOneStartReachesEveryOf3000MacsThroughNanoMDM(t *testing.T) {
	n := testkit.EnvInt("STEPCOLLECT_E2E_MACS", 3000)
	s := startRealStack(t, 1)
	begin := time.Now()
	// UDIDs as long as a Mac's (25 characters). The Macs poll seldom: each
	// is woken after the start, as NanoMDM's push would.
	f := s.macs(t, mdmsim.FleetConfig{N: n, UDIDPrefix: "00008103-0000000000", PollEvery: 30 * time.Second, Logf: t.Logf})
	enrolled := time.Since(begin)
	run(t, f)
	begin = time.Now()
	ids := f.IDs()
	s.startFor(t, wfInventory, "", ids...)
	started := time.Since(begin)
	f.Wake()
	testkit.WaitUntil(t, 5*time.Minute, fmt.Sprintf("%d Macs' inventory", n), func() (bool, any) {
		if _, failed := s.hook.answers(); len(failed) > 0 {
			return true, nil // noFailedWebhook says which
		}
		p := f.Progress()
		if p.Acknowledged < int64(2*n) {
			return false, p
		}
		rows := testkit.CountStepRows(t, s.db.DB)
		inv := testkit.Count(t, s.db.DB, "SELECT COUNT(*) FROM subsystem_inventory")
		return inv == n && rows == testkit.StepRows{}, fmt.Sprintf("%v; %d inventories; step rows %+v", p, inv, rows)
	})
	done := time.Since(begin)
	if s.noFailedWebhook(t); t.Failed() {
		t.FailNow()
	}

	var got map[string]map[string]any
	body := s.mustCall(t, "GET", "/v1/inventory?"+url.Values{"id": ids}.Encode(), nil)
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	missing := 0
	for _, d := range f.Devices() {
		if got[d.UDID]["serial_number"] != d.Serial || got[d.UDID]["sip_enabled"] != true {
			missing++
		}
		if a := answered(d); !slices.Equal(slices.Sorted(slices.Values(a)), []string{"DeviceInformation", "SecurityInfo"}) {
			t.Errorf("%s answered %v, want DeviceInformation, SecurityInfo once each", d.UDID, a)
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d Macs lack their values in the inventory route", missing, n)
	}
	counts, _ := s.hook.answers()
	t.Logf("%d Macs: enrolled in %v; the start answered in %v; every inventory in %v after it; webhook answers by status %v",
		n, enrolled.Round(time.Millisecond), started.Round(time.Millisecond), done.Round(time.Millisecond), counts)
}
