package mdmsim_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jessepeterson/mdmcommands"
	"github.com/micromdm/plist"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

const hmacKey = "webhook-secret"

// bundle is a NanoMDM server, the recorder of its webhook, and a fleet
// talking to it.
type bundle struct {
	srv   *nanomdm.Server
	hook  *nanomdm.Webhook
	fleet *mdmsim.Fleet
}

// setup starts NanoMDM (inmem) and enrolls a fleet of cfg.N devices in it.
func setup(t *testing.T, cfg mdmsim.FleetConfig) *bundle {
	t.Helper()
	b := &bundle{hook: nanomdm.NewWebhook(t, hmacKey)}
	b.srv = nanomdm.Start(t, nanomdm.Options{WebhookURL: b.hook.URL, HMACKey: hmacKey})
	cfg.Logf = t.Logf
	var err error
	b.fleet, err = mdmsim.NewFleet(b.srv.CA, mdmsim.Target{MDMURL: b.srv.MDMURL, CertHeader: b.srv.CertHeader}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.fleet.Enroll(ctx); err != nil {
		t.Fatalf("enrolling: %v\n%s", err, b.srv.Logs())
	}
	return b
}

// enqueue enqueues command to ids as NanoCMD does (the push failing: see
// package nanomdm) and fails t unless NanoMDM queued it.
func (b *bundle) enqueue(t *testing.T, command []byte, ids ...string) {
	t.Helper()
	r, err := b.srv.Enqueue(context.Background(), command, ids...)
	if err != nil || r.EnqueueError != nil || len(r.Status) > 0 {
		t.Fatalf("enqueueing to %d ids: %v %d %s", len(ids), err, r.HTTPStatus, r.Body)
	}
}

// run polls until the fleet is idle for a second.
func (b *bundle) run(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := b.fleet.Run(ctx); err != nil {
		t.Fatalf("the fleet ran until its deadline: %v", err)
	}
	if errs := b.fleet.Errors(); len(errs) > 0 {
		t.Errorf("polls failed: %v", errs)
	}
}

// awaitAcks waits until NanoMDM posted a report of uuid from each device
// of ids.
func (b *bundle) awaitAcks(t *testing.T, uuid string, ids []string) map[string][]nanomdm.Ack {
	t.Helper()
	var acks map[string][]nanomdm.Ack
	testkit.WaitUntil(t, 30*time.Second, fmt.Sprintf("webhook posts of %s from %d devices", uuid, len(ids)), func() (bool, any) {
		acks = b.hook.AcksOf(uuid)
		return len(acks) >= len(ids), fmt.Sprintf("%d devices' posts", len(acks))
	})
	return acks
}

func deviceInformation(uuid string) []byte {
	cmd := mdmcommands.NewDeviceInformationCommand(uuid)
	cmd.Command.Queries = []string{"SerialNumber", "Model", "DeviceName", "OSVersion", "UDID"}
	b, err := plist.Marshal(cmd)
	if err != nil {
		panic(err)
	}
	return b
}

// decode reads a report as NanoCMD's engine does.
func decode[T any](t *testing.T, requestType string, raw []byte) *T {
	t.Helper()
	resp := mdmcommands.NewResponse(requestType)
	if err := plist.Unmarshal(raw, resp); err != nil {
		t.Fatalf("decoding a %s report: %v\n%s", requestType, err, raw)
	}
	return resp.(*T)
}

// Devices enrolled in NanoMDM answer a command enqueued to all of them at
// once, each with its own inventory, and NanoMDM posts each answer to its
// webhook. STEPCOLLECT_MDMSIM_N sizes the fleet (20; 3,000 is what it is
// meant to carry).
func TestAFleetAnswersACommandEnqueuedToAllOfIt(t *testing.T) {
	t.Parallel()
	start := time.Now()
	n := testkit.EnvInt("STEPCOLLECT_MDMSIM_N", 20)
	b := setup(t, mdmsim.FleetConfig{N: n, PollEvery: 5 * time.Second, IdleAfter: time.Second})
	enrolled := time.Since(start)
	ids := b.fleet.IDs()
	b.enqueue(t, deviceInformation("CMD-ALL"), ids...)
	cpu := cpuNow(t, b.srv)
	b.fleet.Wake() // as NanoMDM's push would, had it a certificate
	b.run(t)

	acks := b.awaitAcks(t, "CMD-ALL", ids)
	for _, d := range b.fleet.Devices() {
		if got := d.Answers("CMD-ALL"); !slices.Equal(got, []string{"Acknowledged"}) {
			t.Errorf("%s answered %v, want Acknowledged once", d.UDID, got)
			continue
		}
		a := acks[d.UDID]
		if len(a) != 1 || a[0].Status != "Acknowledged" {
			t.Errorf("%s: webhook posts %v, want one Acknowledged", d.UDID, a)
			continue
		}
		r := decode[mdmcommands.DeviceInformationResponse](t, "DeviceInformation", a[0].Raw)
		q := r.QueryResponses
		if r.Validate() != nil || q.SerialNumber == nil || *q.SerialNumber != d.Serial || q.UDID == nil || *q.UDID != d.UDID ||
			q.Model == nil || q.DeviceName == nil || q.OSVersion == nil || q.ModelName != nil {
			t.Errorf("%s's report: %s\nwant the queried SerialNumber %s, UDID, Model, DeviceName, OSVersion and nothing else", d.UDID, a[0].Raw, d.Serial)
		}
	}
	p := b.fleet.Progress()
	if p.Enrolled != int64(n) || p.Acknowledged != int64(n) || p.Commands != int64(n) || p.Failures != 0 {
		t.Errorf("progress: %v, want %d enrolled and %d acknowledged, nothing else", p, n, n)
	}
	if topics := b.hook.Topics(); topics["mdm.Authenticate"] != n || topics["mdm.TokenUpdate"] != n {
		t.Errorf("webhook topics %v, want %d Authenticate and TokenUpdate", topics, n)
	}
	used := cpuNow(t, b.srv)
	t.Logf("%d devices: enrolled in %v, all answered and posted in %v; from the wake on, CPU per poll: NanoMDM %v, the test process %v",
		n, enrolled.Round(time.Millisecond), time.Since(start).Round(time.Millisecond),
		(used[0]-cpu[0])/time.Duration(p.Polls), (used[1]-cpu[1])/time.Duration(p.Polls))
}

// cpuNow is the CPU time NanoMDM and this test process (the devices,
// the webhook's recorder) used so far.
func cpuNow(t *testing.T, srv *nanomdm.Server) [2]time.Duration {
	t.Helper()
	server, err := testkit.ProcessCPU(srv.Proc.PID())
	if err != nil {
		t.Fatal(err)
	}
	self, err := testkit.ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	return [2]time.Duration{server, self}
}

// A device told to fail a request type answers it Error with an
// ErrorChain, one told NotNow answers it so twice and then Acknowledged
// (NanoMDM hands a NotNow command out again at the next poll); NanoMDM
// posts each answer, in that order.
func TestErrorAndNotNowAnswersReachTheWebhook(t *testing.T) {
	t.Parallel()
	b := setup(t, mdmsim.FleetConfig{N: 4, PollEvery: 100 * time.Millisecond, IdleAfter: time.Second,
		Behavior: func(i int) mdmsim.Behavior {
			switch i {
			case 1:
				return mdmsim.Behavior{Errors: []string{"DeviceInformation"}}
			case 2:
				return mdmsim.Behavior{NotNow: map[string]int{"DeviceInformation": 2}}
			case 3:
				return mdmsim.Behavior{NotNow: map[string]int{"": 1}}
			}
			return mdmsim.Behavior{}
		}})
	ids := b.fleet.IDs()
	b.enqueue(t, deviceInformation("CMD-MIXED"), ids...)
	b.run(t)

	want := map[string][]string{ids[0]: {"Acknowledged"}, ids[1]: {"Error"},
		ids[2]: {"NotNow", "NotNow", "Acknowledged"}, ids[3]: {"NotNow", "Acknowledged"}}
	var acks map[string][]nanomdm.Ack
	testkit.WaitUntil(t, 30*time.Second, "every answer posted", func() (bool, any) {
		acks = b.hook.AcksOf("CMD-MIXED")
		for id, statuses := range want {
			if len(acks[id]) != len(statuses) {
				return false, acks
			}
		}
		return true, nil
	})
	for i, d := range b.fleet.Devices() {
		if got := d.Answers("CMD-MIXED"); !slices.Equal(got, want[d.UDID]) {
			t.Errorf("device %d answered %v, want %v", i, got, want[d.UDID])
		}
		var posted []string
		for _, a := range acks[d.UDID] {
			posted = append(posted, a.Status)
		}
		// the webhook's posts are concurrent: their order is not theirs
		slices.Sort(posted)
		if w := slices.Sorted(slices.Values(want[d.UDID])); !slices.Equal(posted, w) {
			t.Errorf("device %d: webhook posts %v, want %v", i, posted, w)
		}
	}
	r := decode[mdmcommands.DeviceInformationResponse](t, "DeviceInformation", acks[ids[1]][0].Raw)
	if r.Validate() == nil || r.ErrorChain == nil || !strings.Contains(r.ErrorChain.Error(), "(MCMDMErrorDomain, 12021)") {
		t.Errorf("the Error report: %s\nwant an ErrorChain (MCMDMErrorDomain, 12021)", acks[ids[1]][0].Raw)
	}
	if p := b.fleet.Progress(); p.Errors != 1 || p.NotNow != 3 || p.Acknowledged != 3 {
		t.Errorf("progress %v, want 1 Error, 3 NotNow, 3 Acknowledged", p)
	}
}

// A device that authenticates again is a new enrollment to NanoMDM, which
// clears its queue: a command enqueued before is never handed out.
func TestADeviceThatReauthenticatesLosesItsQueuedCommands(t *testing.T) {
	t.Parallel()
	b := setup(t, mdmsim.FleetConfig{N: 1, Behavior: func(int) mdmsim.Behavior { return mdmsim.Behavior{ReauthenticateAfter: 1} }})
	d := b.fleet.Devices()[0]
	b.enqueue(t, deviceInformation("CMD-BEFORE"), d.UDID)
	if n, err := d.Poll(context.Background()); n != 1 || err != nil {
		t.Fatalf("first poll: %d answered, %v", n, err)
	}
	b.enqueue(t, deviceInformation("CMD-LOST"), d.UDID)
	if n, err := d.Poll(context.Background()); n != 0 || err != nil {
		t.Errorf("poll after re-authenticating: %d answered, %v; want none (NanoMDM cleared the queue)", n, err)
	}
	var kinds []string
	for _, e := range d.Exchanges() {
		kinds = append(kinds, e.MessageType+e.CommandUUID)
	}
	if want := []string{"Authenticate", "TokenUpdate", "CMD-BEFORE", "Authenticate", "TokenUpdate"}; !slices.Equal(kinds, want) {
		t.Errorf("exchanges %v, want %v", kinds, want)
	}
	testkit.WaitUntil(t, 10*time.Second, "two Authenticate posts", func() (bool, any) {
		topics := b.hook.Topics()
		return topics["mdm.Authenticate"] == 2 && topics["mdm.TokenUpdate"] == 2, topics
	})
	b.enqueue(t, deviceInformation("CMD-AFTER"), d.UDID)
	if n, err := d.Poll(context.Background()); n != 1 || err != nil {
		t.Errorf("poll after enqueueing again: %d answered, %v; want CMD-AFTER", n, err)
	}
}
