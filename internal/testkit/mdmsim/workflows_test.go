package mdmsim_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jessepeterson/mdmcommands"
	"github.com/micromdm/nanocmd/mdm"
	cpstorage "github.com/micromdm/nanocmd/subsystem/cmdplan/storage"
	cpinmem "github.com/micromdm/nanocmd/subsystem/cmdplan/storage/inmem"
	fvinmem "github.com/micromdm/nanocmd/subsystem/filevault/storage/inmem"
	"github.com/micromdm/nanocmd/subsystem/filevault/storage/invprk"
	invstorage "github.com/micromdm/nanocmd/subsystem/inventory/storage"
	invinmem "github.com/micromdm/nanocmd/subsystem/inventory/storage/inmem"
	profstorage "github.com/micromdm/nanocmd/subsystem/profile/storage"
	profinmem "github.com/micromdm/nanocmd/subsystem/profile/storage/inmem"
	"github.com/micromdm/nanocmd/workflow"
	"github.com/micromdm/nanocmd/workflow/certprof"
	"github.com/micromdm/nanocmd/workflow/cmdplan"
	"github.com/micromdm/nanocmd/workflow/devinfolog"
	"github.com/micromdm/nanocmd/workflow/fvenable"
	"github.com/micromdm/nanocmd/workflow/fvrotate"
	"github.com/micromdm/nanocmd/workflow/inventory"
	"github.com/micromdm/nanocmd/workflow/lock"
	"github.com/micromdm/nanocmd/workflow/profile"
	"github.com/micromdm/nanolib/log"
	"github.com/micromdm/plist"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

// runner drives NanoCMD v0.7.1's workflows for one device as NanoCMD's
// engine would, through NanoMDM: each command of each step a workflow
// enqueues goes to NanoMDM, the device answers it at its poll, NanoMDM
// posts the report to its webhook, the report is decoded as the engine
// decodes it, and the step's reports go to the workflow's StepCompleted,
// until it enqueues no more steps. NotUntil is not waited for.
type runner struct {
	t        *testing.T
	srv      *nanomdm.Server
	hook     *nanomdm.Webhook
	dev      *mdmsim.Device
	pending  []*workflow.StepEnqueueing
	sent     []string // request types of the last run, in order
	statuses []string // their reports' statuses
	results  []any    // their reports, decoded
}

func (r *runner) EnqueueStep(_ context.Context, _ workflow.Namer, se *workflow.StepEnqueueing) error {
	r.pending = append(r.pending, se)
	return nil
}

// run starts w with wfCtx (and event) and completes its steps; it returns
// the request types sent, in order.
func (r *runner) run(w workflow.Workflow, wfCtx workflow.ContextMarshaler, event *workflow.Event) []string {
	r.t.Helper()
	ctx := context.Background()
	r.sent, r.statuses, r.results = nil, nil, nil
	start := &workflow.StepStart{StepContext: workflow.StepContext{InstanceID: "instance-1", Context: wfCtx}, IDs: []string{r.dev.UDID}, Event: event}
	if err := w.Start(ctx, start); err != nil {
		r.t.Fatalf("%s: start: %v", w.Name(), err)
	}
	for len(r.pending) > 0 {
		se := r.pending[0]
		r.pending = r.pending[1:]
		result := &workflow.StepResult{StepContext: workflow.StepContext{InstanceID: se.InstanceID, Name: se.Name}, ID: r.dev.UDID}
		// the step's context round-trips through bytes, as the engine stores it
		if result.Context = w.NewContextValue(se.Name); result.Context != nil && se.Context != nil {
			b, err := se.Context.MarshalBinary()
			if err == nil {
				err = result.Context.UnmarshalBinary(b)
			}
			if err != nil {
				r.t.Fatalf("%s: step %q context: %v", w.Name(), se.Name, err)
			}
		}
		for _, c := range se.Commands {
			result.CommandResults = append(result.CommandResults, r.send(c))
		}
		if err := w.StepCompleted(ctx, result); err != nil {
			r.t.Fatalf("%s: step %q completed: %v", w.Name(), se.Name, err)
		}
	}
	return r.sent
}

// send has the device answer c and returns the report as the engine
// decodes it.
func (r *runner) send(c any) any {
	r.t.Helper()
	gen := c.(mdmcommands.GenericCommander).GenericCommand()
	raw, err := plist.Marshal(c)
	if err != nil {
		r.t.Fatal(err)
	}
	if res, err := r.srv.EnqueueNoPush(context.Background(), raw, r.dev.UDID); err != nil || res.HTTPStatus != 200 {
		r.t.Fatalf("enqueueing %s: %v %d %s", gen.Command.RequestType, err, res.HTTPStatus, res.Body)
	}
	if n, err := r.dev.Poll(context.Background()); n != 1 || err != nil {
		r.t.Fatalf("the device answered %d commands (%v), want the %s", n, err, gen.Command.RequestType)
	}
	var acks []nanomdm.Ack
	testkit.WaitUntil(r.t, 10*time.Second, "the webhook post of "+gen.CommandUUID, func() (bool, any) {
		acks = r.hook.AcksOf(gen.CommandUUID)[r.dev.UDID]
		return len(acks) > 0, r.hook.Topics()
	})
	resp := mdmcommands.NewResponse(gen.Command.RequestType)
	if err := plist.Unmarshal(acks[0].Raw, resp); err != nil {
		r.t.Fatalf("decoding the %s report: %v\n%s", gen.Command.RequestType, err, acks[0].Raw)
	}
	r.sent = append(r.sent, gen.Command.RequestType)
	r.statuses = append(r.statuses, acks[0].Status)
	r.results = append(r.results, resp)
	return resp
}

func newRunner(t *testing.T, b mdmsim.Behavior) *runner {
	t.Helper()
	hook := nanomdm.NewWebhook(t, "")
	srv := nanomdm.Start(t, nanomdm.Options{WebhookURL: hook.URL})
	d, err := mdmsim.NewDevice(srv.CA, mdmsim.Target{MDMURL: srv.MDMURL, CertHeader: srv.CertHeader}, "WF-000001", b)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Enroll(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &runner{t: t, srv: srv, hook: hook, dev: d}
}

// mobileconfig is a profile of identifier and uuid with payloads (plist
// dictionaries' insides).
func mobileconfig(identifier, uuid string, payloads ...string) []byte {
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
<key>PayloadIdentifier</key><string>%[1]s</string><key>PayloadUUID</key><string>%[2]s</string>
<key>PayloadType</key><string>Configuration</string><key>PayloadVersion</key><integer>1</integer>
<key>PayloadDisplayName</key><string>%[1]s</string>
<key>PayloadContent</key><array>%[3]s</array></dict></plist>`, identifier, uuid, "<dict>"+strings.Join(payloads, "</dict><dict>")+"</dict>")
}

const wifiPayload = `<key>PayloadType</key><string>com.apple.wifi.managed</string><key>PayloadVersion</key><integer>1</integer>
<key>PayloadIdentifier</key><string>com.example.wifi.payload</string><key>PayloadUUID</key><string>WIFI-PAYLOAD-1</string>
<key>SSID_STR</key><string>example</string>`

func scepPayload(cn string) string {
	return `<key>PayloadType</key><string>com.apple.security.scep</string><key>PayloadVersion</key><integer>1</integer>
<key>PayloadIdentifier</key><string>com.example.scep.payload</string><key>PayloadUUID</key><string>SCEP-PAYLOAD-1</string>
<key>PayloadContent</key><dict><key>URL</key><string>https://scep.example.com/scep</string>
<key>Subject</key><array><array><array><string>CN</string><string>` + cn + `</string></array></array></array></dict>`
}

// Every workflow NanoCMD v0.7.1 ships completes on a device's answers,
// reading from them what it stores: the request types each sends are the
// ones the device answers with the fields the workflow reads.
func TestNanoCMDsWorkflowsCompleteOnADevicesAnswers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("inventory and devinfolog", func(t *testing.T) {
		r := newRunner(t, mdmsim.Behavior{})
		inv := invinmem.New()
		w, _ := inventory.New(r, inv)
		if sent := r.run(w, nil, nil); !slices.Equal(sent, []string{"DeviceInformation", "SecurityInfo"}) {
			t.Fatalf("inventory sent %v", sent)
		}
		// the engine hands SecurityInfo reports to the workflow as events
		if err := w.Event(ctx, &workflow.Event{EventData: r.results[1]}, r.dev.UDID, nil); err != nil {
			t.Fatalf("inventory's SecurityInfo event: %v", err)
		}
		vals := inventoryOf(t, inv, r.dev.UDID)
		if vals[invstorage.KeySerialNumber] != r.dev.Serial || vals[invstorage.KeyModel] == nil || vals[invstorage.KeyOSVersion] == nil ||
			vals[invstorage.KeyAppleSilicon] != true || vals[invstorage.KeyEthernetMAC] == nil ||
			vals[invstorage.KeySIPEnabled] != true || vals[invstorage.KeyFDEEnabled] != false {
			t.Errorf("inventory stored %v, want the device's serial number, model, OS version, Apple silicon, MAC, SIP on, FileVault off", vals)
		}
		dl, _ := devinfolog.New(r, log.NopLogger)
		if sent := r.run(dl, nil, nil); !slices.Equal(sent, []string{"DeviceInformation"}) {
			t.Errorf("devinfolog sent %v", sent)
		}
	})

	t.Run("profile", func(t *testing.T) {
		r := newRunner(t, mdmsim.Behavior{})
		store := profinmem.New()
		if err := store.StoreProfile(ctx, "wifi", profstorage.ProfileInfo{Identifier: "com.example.wifi", UUID: "WIFI-1"},
			mobileconfig("com.example.wifi", "WIFI-1", wifiPayload)); err != nil {
			t.Fatal(err)
		}
		w, _ := profile.New(r, store)
		for _, tc := range []struct {
			manage string
			want   []string
		}{
			{"wifi", []string{"ProfileList", "InstallProfile"}},
			{"wifi", []string{"ProfileList"}}, // listed, same UUID: left
			{"-wifi", []string{"ProfileList", "RemoveProfile"}},
			{"-wifi", []string{"ProfileList"}}, // gone
		} {
			c := profile.CommaStringSliceContext{tc.manage}
			if sent := r.run(w, &c, nil); !slices.Equal(sent, tc.want) {
				t.Errorf("profile %s sent %v, want %v", tc.manage, sent, tc.want)
			}
			installed := r.dev.Installed().Profiles
			if want := !strings.HasPrefix(tc.manage, "-"); slices.Contains(installed, "com.example.wifi") != want {
				t.Errorf("after profile %s the device has %v", tc.manage, installed)
			}
			r.allAcknowledged()
		}
	})

	t.Run("certprof", func(t *testing.T) {
		r := newRunner(t, mdmsim.Behavior{})
		store := profinmem.New()
		if err := store.StoreProfile(ctx, "scep", profstorage.ProfileInfo{Identifier: "com.example.scep", UUID: "SCEP-1"},
			mobileconfig("com.example.scep", "SCEP-1", scepPayload("device-%SerialNumber%"))); err != nil {
			t.Fatal(err)
		}
		w, _ := certprof.New(r, store)
		c := &certprof.Context{Profile: "scep", Filter: &certprof.Filter{CNPrefix: "device-"},
			Criteria: &certprof.Criteria{UntilExpirySeconds: 30 * 24 * 3600}, TextReplacements: map[string]string{"%SerialNumber%": r.dev.Serial}}
		if sent := r.run(w, c, nil); !slices.Equal(sent, []string{"CertificateList", "InstallProfile"}) {
			t.Errorf("certprof sent %v, want the profile installed", sent)
		}
		if sent := r.run(w, c, nil); !slices.Equal(sent, []string{"CertificateList"}) {
			t.Errorf("certprof again sent %v, want the identity listed and kept", sent)
		}
		r.allAcknowledged()
	})

	t.Run("cmdplan", func(t *testing.T) {
		r := newRunner(t, mdmsim.Behavior{AwaitingConfiguration: true})
		profs := profinmem.New()
		if err := profs.StoreProfile(ctx, "wifi", profstorage.ProfileInfo{Identifier: "com.example.wifi", UUID: "WIFI-1"},
			mobileconfig("com.example.wifi", "WIFI-1", wifiPayload)); err != nil {
			t.Fatal(err)
		}
		plans := cpinmem.New()
		yes := true
		if err := plans.StoreCMDPlan(ctx, "setup", &cpstorage.CMDPlan{ProfileNames: []string{"wifi"},
			ManifestURLs: []string{"https://example.com/app.plist"}, DeviceConfigured: &yes}); err != nil {
			t.Fatal(err)
		}
		w, _ := cmdplan.New(r, plans, profs)
		c := workflow.StringContext("setup")
		ev := &workflow.Event{EventFlag: workflow.EventEnrollment, EventData: &mdm.TokenUpdate{AwaitingConfiguration: true}}
		if sent := r.run(w, &c, ev); !slices.Equal(sent, []string{"InstallProfile", "InstallApplication", "DeviceConfigured"}) {
			t.Errorf("cmdplan sent %v", sent)
		}
		r.allAcknowledged()
	})

	t.Run("lock", func(t *testing.T) {
		r := newRunner(t, mdmsim.Behavior{})
		inv := invinmem.New()
		w, _ := lock.New(r, inv)
		if sent := r.run(w, nil, nil); !slices.Equal(sent, []string{"DeviceLock"}) {
			t.Errorf("lock sent %v", sent)
		}
		vals := inventoryOf(t, inv, r.dev.UDID)
		if vals[lock.WorkflowName+".received"] == nil {
			t.Errorf("lock stored %v, want the lock received", vals)
		}
		if pin := r.dev.Installed().LockPIN; pin == "" || vals[lock.WorkflowName+".pin"] != pin {
			t.Errorf("the device was locked with %q, the workflow escrowed %v", pin, vals[lock.WorkflowName+".pin"])
		}
	})

	t.Run("fvenable and fvrotate", func(t *testing.T) {
		// FileVault comes on at the second SecurityInfo after the profile
		r := newRunner(t, mdmsim.Behavior{FileVaultDelay: 1})
		inv := invinmem.New()
		fv, err := fvinmem.New(invprk.NewInvPRK(inv))
		if err != nil {
			t.Fatal(err)
		}
		// NanoCMD's own fallback to its template is never reached on its
		// key-value profile storages (a missing profile is an error
		// there): the operator stores it, as here
		profs := profinmem.New()
		if err := profs.StoreProfile(ctx, fvenable.WorkflowName, profstorage.ProfileInfo{Identifier: "io.micromdm.wf.fvenable.v1.profile",
			UUID: "49DDB449-163E-4408-B05D-FA4814CDEE3E"}, []byte(fvenable.ProfileTemplate)); err != nil {
			t.Fatal(err)
		}
		en, _ := fvenable.New(r, fv, profs)
		if sent := r.run(en, nil, nil); !slices.Equal(sent, []string{"InstallProfile", "SecurityInfo", "SecurityInfo"}) {
			t.Fatalf("fvenable sent %v, want the profile, then SecurityInfo until FileVault is on", sent)
		}
		prk := inventoryOf(t, inv, r.dev.UDID)[invstorage.KeyPRK]
		if s, _ := prk.(string); len(s) != 29 || s != r.dev.Installed().RecoveryKey {
			t.Fatalf("fvenable escrowed the recovery key %v, want the device's %q", prk, r.dev.Installed().RecoveryKey)
		}
		rot, _ := fvrotate.New(r, fv)
		if sent := r.run(rot, nil, nil); !slices.Equal(sent, []string{"RotateFileVaultKey"}) {
			t.Fatalf("fvrotate sent %v", sent)
		}
		if again := inventoryOf(t, inv, r.dev.UDID)[invstorage.KeyPRK]; again == prk || again == nil {
			t.Errorf("fvrotate escrowed %v after %v, want a new key", again, prk)
		}
		r.allAcknowledged()
	})
}

func (r *runner) allAcknowledged() {
	r.t.Helper()
	for i, s := range r.statuses {
		if s != "Acknowledged" {
			r.t.Errorf("%s answered %s, want Acknowledged", r.sent[i], s)
		}
	}
}

func inventoryOf(t *testing.T, inv invstorage.ReadStorage, id string) invstorage.Values {
	t.Helper()
	all, err := inv.RetrieveInventory(context.Background(), &invstorage.SearchOptions{IDs: []string{id}})
	if err != nil {
		t.Fatal(err)
	}
	return all[id]
}
