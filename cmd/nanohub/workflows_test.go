package main_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
)

// NanoCMD v0.7.1's workflows, by the names its API starts them by.
const (
	wfProfile    = "io.micromdm.wf.profile.v1"
	wfLock       = "io.micromdm.wf.lock.v1"
	wfCMDPlan    = "io.micromdm.wf.cmdplan.v1"
	wfCertProf   = "io.micromdm.wf.certprof.v1"
	wfDevInfoLog = "io.micromdm.wf.devinfolog.v1"
	wfFVEnable   = "io.micromdm.wf.fvenable.v1"
	wfFVRotate   = "io.micromdm.wf.fvrotate.v1"
)

// mobileconfig is a configuration profile NanoCMD's profile API accepts.
func mobileconfig(identifier, uuid, displayName string) []byte {
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
<key>PayloadContent</key><array/>
<key>PayloadDisplayName</key><string>%s</string>
<key>PayloadIdentifier</key><string>%s</string>
<key>PayloadType</key><string>Configuration</string>
<key>PayloadUUID</key><string>%s</string>
<key>PayloadVersion</key><integer>1</integer>
</dict></plist>`, displayName, identifier, uuid)
}

// answered is the request types d answered finally (not NotNow), in order,
// with their statuses.
func answered(d *mdmsim.Device) (types, statuses []string) {
	for _, e := range d.Exchanges() {
		if e.MessageType == "" && e.Status != "NotNow" {
			types = append(types, e.RequestType)
			statuses = append(statuses, e.Status)
		}
	}
	return types, statuses
}

// awaitAnswered waits until d has answered the request types want (after
// those it had answered before), in any order (NanoMDM's queue orders the
// commands of one step, enqueued in the same second, as it finds them), or
// fails t.
func (h *hub) awaitAnswered(t *testing.T, d *mdmsim.Device, before int, want ...string) {
	t.Helper()
	var got []string
	if _, ok := testkit.Watch(time.Now().Add(30*time.Second), func() bool {
		all, _ := answered(d)
		got = slices.Clone(all[min(before, len(all)):])
		return len(got) >= len(want)
	}); !ok || !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Fatalf("%s answered %v, want %v\n%s", d.UDID, got, want, tail(h.proc.Logs()))
	}
}

// awaitNoStep waits until enrollment id holds no step, or fails t.
func (h *hub) awaitNoStep(t *testing.T, id string) {
	t.Helper()
	testkit.WaitUntil(t, 10*time.Second, id+"'s steps gone", func() (bool, any) {
		n := testkit.Count(t, h.db.DB, "SELECT COUNT(*) FROM id_commands WHERE enrollment_id = ?", id)
		return n == 0, n
	})
}

// mustAPI calls NanoHUB's API and fails t on anything but a 2xx.
func (h *hub) mustAPI(t *testing.T, method, path string, body []byte) []byte {
	t.Helper()
	code, b := h.api(t, method, path, strings.NewReader(string(body)))
	if code/100 != 2 {
		t.Fatalf("%s %s: %d %s", method, path, code, b)
	}
	return b
}

// mustStart starts workflow name for ids and fails t on anything but a 200.
func (h *hub) mustStart(t *testing.T, name, wfCtx string, ids ...string) {
	t.Helper()
	if code, body := h.start(t, name, wfCtx, ids...); code != http.StatusOK {
		t.Fatalf("starting %s: %d %s\n%s", name, code, body, tail(h.proc.Logs()))
	}
}

// inventoryOf is id's inventory.
func (h *hub) inventoryOf(t *testing.T, id string) map[string]any {
	t.Helper()
	var inv map[string]map[string]any
	decodeJSON(t, h.mustAPI(t, http.MethodGet, "/api/v1/nanocmd/inventory?id="+id, nil), &inv)
	return inv[id]
}

// Every workflow of NanoCMD v0.7.1 through NanoHUB's API on -storage mysql
// (NanoHUB v0.2.0 registers three there), each on a simulated Mac of its
// own speaking the MDM protocol to the binary's /mdm; an answer NotNow,
// an Error answer, a re-Authenticate cancelling a queued step, and an
// enrollment event subscription; at the end no
// step row is left.
func TestEveryWorkflowThroughNanoHUBOnMySQL(t *testing.T) {
	const (
		profDev = iota
		lockDev
		planDev
		certDev
		devinfoDev
		fvDev
		notNowDev
		errorDev
		n
	)
	h := startHub(t, hubOptions{N: n, Args: []string{"-worker-interval", "1"}, Behavior: func(i int) mdmsim.Behavior {
		switch i {
		case notNowDev:
			return mdmsim.Behavior{NotNow: map[string]int{"": 2}}
		case errorDev:
			return mdmsim.Behavior{Errors: []string{"SecurityInfo"}}
		}
		return mdmsim.Behavior{}
	}})
	devs := h.fleet.Devices()
	h.mustAPI(t, http.MethodPut, "/api/v1/nanocmd/profile/wifi", mobileconfig("com.example.wifi", "WIFI-UUID-1", "Wi-Fi"))
	h.mustAPI(t, http.MethodPut, "/api/v1/nanocmd/profile/scep", mobileconfig("com.example.scep", "SCEP-UUID-1", "SCEP %CN%"))
	h.mustAPI(t, http.MethodPut, "/api/v1/nanocmd/cmdplan/setup", []byte(`{"profile_names":["wifi"],"manifest_urls":["https://example.com/app.plist"],"device_configured":true}`))

	t.Run("profile", func(t *testing.T) {
		d := devs[profDev]
		h.mustStart(t, wfProfile, "wifi", d.UDID)
		h.awaitAnswered(t, d, 0, "ProfileList", "InstallProfile")
		h.awaitNoStep(t, d.UDID) // the engine hears of an answer after the device had NanoMDM's
		h.mustStart(t, wfProfile, "-wifi", d.UDID)
		h.awaitAnswered(t, d, 2, "ProfileList", "RemoveProfile")
	})
	t.Run("lock", func(t *testing.T) {
		d := devs[lockDev]
		h.mustStart(t, wfLock, "", d.UDID)
		h.awaitAnswered(t, d, 0, "DeviceLock")
		testkit.WaitUntil(t, 10*time.Second, "the lock received in the inventory", func() (bool, any) {
			inv := h.inventoryOf(t, d.UDID)
			return inv[wfLock+".received"] != nil && inv[wfLock+".pin"] != nil, inv
		})
	})
	t.Run("cmdplan", func(t *testing.T) {
		d := devs[planDev]
		h.mustStart(t, wfCMDPlan, "setup", d.UDID)
		// DeviceConfigured only for an enrollment awaiting configuration
		h.awaitAnswered(t, d, 0, "InstallProfile", "InstallApplication")
	})
	t.Run("certprof", func(t *testing.T) {
		d := devs[certDev]
		h.mustStart(t, wfCertProf, `{"profile":"scep","filter":{"cn_prefix":"device-"},"text_replacements":{"%CN%":"device-`+d.UDID+`"}}`, d.UDID)
		h.awaitAnswered(t, d, 0, "CertificateList", "InstallProfile")
	})
	t.Run("devinfolog", func(t *testing.T) {
		d := devs[devinfoDev]
		h.mustStart(t, wfDevInfoLog, "", d.UDID)
		h.awaitAnswered(t, d, 0, "DeviceInformation")
		testkit.WaitUntil(t, 10*time.Second, "the device information logged", func() (bool, any) {
			return strings.Contains(h.proc.Logs(), "UDID="+d.UDID+", SerialNumber="+d.Serial), nil
		})
	})
	t.Run("fvenable then fvrotate", func(t *testing.T) {
		d := devs[fvDev]
		h.mustStart(t, wfFVEnable, "", d.UDID)
		h.awaitAnswered(t, d, 0, "InstallProfile")
		// polled with SecurityInfo two minutes later: brought forward
		testkit.WaitUntil(t, 10*time.Second, "the SecurityInfo poll stored", func() (bool, any) {
			n := testkit.Count(t, h.db.DB, "SELECT COUNT(*) FROM steps WHERE not_until IS NOT NULL")
			return n > 0, n
		})
		if _, err := h.db.Exec("UPDATE steps SET not_until = not_until - INTERVAL 121 SECOND WHERE not_until IS NOT NULL"); err != nil {
			t.Fatal(err)
		}
		h.awaitAnswered(t, d, 1, "SecurityInfo")
		var prk any
		testkit.WaitUntil(t, 10*time.Second, "the PRK escrowed", func() (bool, any) {
			prk = h.inventoryOf(t, d.UDID)["prk"]
			return prk != nil, prk
		})
		h.awaitNoStep(t, d.UDID)
		h.mustStart(t, wfFVRotate, "", d.UDID)
		h.awaitAnswered(t, d, 2, "RotateFileVaultKey")
		testkit.WaitUntil(t, 10*time.Second, "the new PRK escrowed", func() (bool, any) {
			now := h.inventoryOf(t, d.UDID)["prk"]
			return now != nil && now != prk, now
		})
	})
	t.Run("NotNow, then answered", func(t *testing.T) {
		d := devs[notNowDev]
		h.mustStart(t, inventory, "", d.UDID)
		h.awaitAnswered(t, d, 0, "DeviceInformation", "SecurityInfo")
		testkit.WaitUntil(t, 10*time.Second, "the inventory", func() (bool, any) {
			inv := h.inventoryOf(t, d.UDID)
			return inv["serial_number"] == d.Serial && inv["sip_enabled"] != nil, inv
		})
	})
	t.Run("an Error answer completes the step", func(t *testing.T) {
		d := devs[errorDev]
		h.mustStart(t, inventory, "", d.UDID)
		h.awaitAnswered(t, d, 0, "DeviceInformation", "SecurityInfo")
		for _, e := range d.Exchanges() {
			if want := map[string]string{"DeviceInformation": "Acknowledged", "SecurityInfo": "Error"}[e.RequestType]; e.Status != want {
				t.Errorf("%s answered %s, want %s", e.RequestType, e.Status, want)
			}
		}
		h.awaitNoStep(t, d.UDID)
	})
	t.Run("a re-Authenticate cancels the steps", func(t *testing.T) {
		// a Mac of its own, polling only when the test says
		d, err := mdmsim.NewDevice(h.ca, mdmsim.Target{MDMURL: h.base + "/mdm", CertHeader: certHeader}, "REAUTH-1", mdmsim.Behavior{ReauthenticateAfter: 1})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := d.Enroll(ctx); err != nil {
			t.Fatal(err)
		}
		h.mustStart(t, wfLock, "", d.UDID)
		if n, err := d.Poll(ctx); n != 1 || err != nil {
			t.Fatalf("answered %d commands (%v), want the DeviceLock", n, err)
		}
		h.awaitNoStep(t, d.UDID)
		// queued, then the Mac enrolls again before it polls: NanoMDM clears
		// its queue, and the engine must cancel the step, or it waits for
		// its timeout
		h.mustStart(t, inventory, "", d.UDID)
		if n, err := d.Poll(ctx); n != 0 || err != nil {
			t.Fatalf("answered %d commands (%v) after re-enrolling, want none", n, err)
		}
		h.awaitNoStep(t, d.UDID)
		if inv := h.inventoryOf(t, d.UDID); inv["serial_number"] != nil {
			t.Errorf("a cancelled inventory completed: %v", inv)
		}
		h.mustStart(t, wfLock, "", d.UDID) // not outstanding any more
		if n, err := d.Poll(ctx); n != 1 || err != nil {
			t.Fatalf("answered %d commands (%v), want the DeviceLock started again", n, err)
		}
		h.awaitNoStep(t, d.UDID)
	})
	t.Run("cmdplan on enrollment", func(t *testing.T) {
		h.mustAPI(t, http.MethodPut, "/api/v1/nanocmd/event/enroll-setup", fmt.Appendf(nil, `{"event":"Enrollment","workflow":%q,"context":"setup"}`, wfCMDPlan))
		d, err := mdmsim.NewDevice(h.ca, mdmsim.Target{MDMURL: h.base + "/mdm", CertHeader: certHeader}, "ENROLL-1", mdmsim.Behavior{AwaitingConfiguration: true})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := d.Enroll(ctx); err != nil {
			t.Fatal(err)
		}
		want := []string{"InstallProfile", "InstallApplication", "DeviceConfigured"}
		testkit.WaitUntil(t, 30*time.Second, "the enrollment's command plan", func() (bool, any) {
			if _, err := d.Poll(ctx); err != nil {
				return false, err
			}
			got, _ := answered(d)
			return len(got) >= len(want), got
		})
		if got, _ := answered(d); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
			t.Errorf("answered %v, want %v", got, want)
		}
	})

	testkit.WaitUntil(t, 30*time.Second, "no step row left", func() (bool, any) {
		rows := testkit.CountStepRows(t, h.db.DB)
		return rows == testkit.StepRows{}, rows
	})
}
