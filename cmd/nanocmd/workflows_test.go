package main_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/micromdm/plist"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// NanoCMD v0.7.1's workflows, by the names its API starts them by.
const (
	wfInventory  = inventory
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

// Every workflow of NanoCMD v0.7.1, each started through NanoCMD's API or
// by an event subscription, every command answered as a Mac answers it
// through NanoMDM's webhook sender, on one binary with -storage mysql and
// NanoCMD's engine worker every second. The FileVault keypair survives a
// restart of the binary between fvenable's install and the PRK's escrow,
// and fvrotate then rotates with that PRK and that certificate. At the end
// no step row is left and no command was enqueued twice.
func TestEveryWorkflowOfNanoCMDEndToEnd(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	c := startCluster(t, db, 1, "-worker-interval", "1")
	everyWorkflow(t, c, func(t *testing.T) { c.restart(t, 0) })
	c.noStepRowsLeft(t)
	c.noCommandEnqueuedTwice(t)
}

// everyWorkflow runs each of NanoCMD v0.7.1's workflows, its event
// subscriptions and its cancellation on c, each on Macs of its own. restart restarts the binary (or every
// replica).
func everyWorkflow(t *testing.T, c *cluster, restart func(t *testing.T)) {
	sender := c.sender()
	c.mustCall(t, "PUT", "/v1/profile/wifi", mobileconfig("com.example.wifi", "WIFI-UUID-1", "Wi-Fi"))

	t.Run("inventory, answers at once", func(t *testing.T) {
		var macs []*mac
		for i := range 8 {
			macs = append(macs, newMac(fmt.Sprintf("INV-%02d", i)))
		}
		c.start(t, wfInventory, "", macs...)
		// both commands of every Mac answered at the same moment: on two
		// replicas, the step's last two results commit side by side
		var wg sync.WaitGroup
		errs := make(chan error, 2*len(macs))
		for _, m := range macs {
			for _, e := range m.pending(c.mdm) {
				wg.Go(func() { errs <- m.answer(sender, c.mdm, e) })
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, m := range macs {
			inv := c.inventory(t, m.id)
			if inv["serial_number"] != "SN"+m.id || inv["sip_enabled"] != true {
				t.Errorf("%s: inventory %v, want both commands' values", m.id, inv)
			}
		}
	})

	t.Run("profile", func(t *testing.T) {
		a, b := newMac("PROF-A"), newMac("PROF-B")
		c.start(t, wfProfile, "wifi", a, b)
		got := drain(t, sender, c.mdm, a, b)
		for _, m := range []*mac{a, b} {
			if want := []string{"ProfileList", "InstallProfile"}; !slices.Equal(got[m.id], want) {
				t.Fatalf("%s answered %v, want %v", m.id, got[m.id], want)
			}
			if want := []installedProfile{{"com.example.wifi", "WIFI-UUID-1"}}; !slices.Equal(m.profiles, want) {
				t.Errorf("%s has profiles %v, want %v", m.id, m.profiles, want)
			}
		}
		// installed with the same UUID: listed, not installed again
		c.start(t, wfProfile, "wifi", b)
		if got := drain(t, sender, c.mdm, b); !slices.Equal(got[b.id], []string{"ProfileList"}) {
			t.Errorf("%s, already installed, answered %v, want only ProfileList", b.id, got[b.id])
		}
		// "-name": removed where installed
		c.start(t, wfProfile, "-wifi", a)
		if got := drain(t, sender, c.mdm, a); !slices.Equal(got[a.id], []string{"ProfileList", "RemoveProfile"}) {
			t.Errorf("%s, removing, answered %v, want ProfileList, RemoveProfile", a.id, got[a.id])
		}
		if len(a.profiles) != 0 {
			t.Errorf("%s still has %v", a.id, a.profiles)
		}
	})

	t.Run("lock", func(t *testing.T) {
		m := newMac("LOCK-A")
		c.start(t, wfLock, "", m)
		lock := c.waitForCommand(t, m, "DeviceLock", 5*time.Second)
		var cmd command
		if err := plist.Unmarshal(c.mdm.command(lock.UUID), &cmd); err != nil || len(cmd.Command.PIN) != 6 {
			t.Fatalf("DeviceLock %q: %v, want a 6-digit PIN", cmd.Command.PIN, err)
		}
		inv := c.inventory(t, m.id)
		if inv[wfLock+".pin"] != cmd.Command.PIN || inv[wfLock+".received"] != nil {
			t.Fatalf("inventory before the answer: %v, want the PIN %s escrowed and nothing received", inv, cmd.Command.PIN)
		}
		drain(t, sender, c.mdm, m)
		inv = c.inventory(t, m.id)
		if inv[wfLock+".received"] == nil || inv[wfLock+".message_result"] != "locked with "+cmd.Command.PIN {
			t.Errorf("inventory after the answer: %v, want received and the message result", inv)
		}
	})

	t.Run("cmdplan by API and on enrollment", func(t *testing.T) {
		c.mustCall(t, "PUT", "/v1/cmdplan/setup", []byte(`{"profile_names":["wifi"],"manifest_urls":["https://example.com/app.plist"],"device_configured":true}`))
		c.mustCall(t, "PUT", "/v1/event/enroll-setup", fmt.Appendf(nil, `{"event":"Enrollment","workflow":%q,"context":"setup"}`, wfCMDPlan))
		byAPI, enrolled := newMac("PLAN-A"), newMac("PLAN-B")
		c.start(t, wfCMDPlan, "setup", byAPI)
		if err := enrolled.enroll(c.base + "/webhook"); err != nil {
			t.Fatal(err)
		}
		got := drain(t, sender, c.mdm, byAPI, enrolled)
		// DeviceConfigured only for an enrollment awaiting configuration
		if want := []string{"InstallProfile", "InstallApplication"}; !slices.Equal(got[byAPI.id], want) {
			t.Errorf("%s (started by the API) answered %v, want %v", byAPI.id, got[byAPI.id], want)
		}
		if want := []string{"InstallProfile", "InstallApplication", "DeviceConfigured"}; !slices.Equal(got[enrolled.id], want) {
			t.Errorf("%s (enrolled) answered %v, want %v", enrolled.id, got[enrolled.id], want)
		}
		if want := []installedProfile{{"com.example.wifi", "WIFI-UUID-1"}}; !slices.Equal(enrolled.profiles, want) {
			t.Errorf("%s has profiles %v, want %v", enrolled.id, enrolled.profiles, want)
		}
	})

	t.Run("certprof", func(t *testing.T) {
		c.mustCall(t, "PUT", "/v1/profile/scep", mobileconfig("com.example.scep", "SCEP-UUID-1", "SCEP %CN%"))
		m := newMac("CERT-A")
		c.start(t, wfCertProf, `{"profile":"scep","filter":{"cn_prefix":"device-"},"text_replacements":{"%CN%":"device-CERT-A"}}`, m)
		got := drain(t, sender, c.mdm, m)
		if want := []string{"CertificateList", "InstallProfile"}; !slices.Equal(got[m.id], want) {
			t.Fatalf("%s answered %v, want %v", m.id, got[m.id], want)
		}
		if p := m.payloads[0]; !bytes.Contains(p, []byte("SCEP device-CERT-A")) || bytes.Contains(p, []byte("%CN%")) {
			t.Errorf("the profile installed has not had its text replaced:\n%s", p)
		}
	})

	t.Run("device-info log", func(t *testing.T) {
		m := newMac("DEVINFO-A")
		c.start(t, wfDevInfoLog, "", m)
		if got := drain(t, sender, c.mdm, m); !slices.Equal(got[m.id], []string{"DeviceInformation"}) {
			t.Fatalf("%s answered %v, want DeviceInformation", m.id, got[m.id])
		}
		testkit.WaitUntil(t, 5*time.Second, "the device information logged", func() (bool, any) {
			return strings.Contains(c.logs(), "UDID=DEVINFO-A, SerialNumber=SNDEVINFO-A, Model=Mac14,2, ModelName=MacBook Air"), nil
		})
	})

	t.Run("fvenable then fvrotate across a restart", func(t *testing.T) {
		// no template uploaded: the workflow's built-in one
		m := newMac("FV-A")
		c.start(t, wfFVEnable, "", m)
		if got := drain(t, sender, c.mdm, m); !slices.Equal(got[m.id], []string{"InstallProfile"}) {
			t.Fatalf("%s answered %v, want InstallProfile", m.id, got[m.id])
		}
		if m.escrowCert == nil {
			t.Fatal("the FileVault profile carried no certificate")
		}
		// polled with SecurityInfo every two minutes until FileVault is on;
		// the binary restarted between the polls, so that the PRK the Mac
		// encrypts to the certificate of before is decrypted after
		for _, fdeOn := range []bool{false, true} {
			if fdeOn {
				m.enableFileVault()
				restart(t)
			}
			if n := c.passNotUntil(t); n != 1 {
				t.Fatalf("%d steps waiting for their NotUntil, want the one poll", n)
			}
			c.waitForCommand(t, m, "SecurityInfo", 15*time.Second)
			drain(t, sender, c.mdm, m)
		}
		prk := m.currentPRK()
		if got := c.inventory(t, m.id)["prk"]; got != prk {
			t.Fatalf("escrowed PRK %v, want the Mac's %s (encrypted to the certificate of before the restart)", got, prk)
		}
		if n := testkit.Count(t, c.db.DB, "SELECT COUNT(*) FROM steps WHERE workflow_name = ?", wfFVEnable); n != 0 {
			t.Errorf("%d fvenable steps left after the PRK was escrowed", n)
		}

		c.start(t, wfFVRotate, "", m)
		rotate := c.waitForCommand(t, m, "RotateFileVaultKey", 5*time.Second)
		var cmd command
		if err := plist.Unmarshal(c.mdm.command(rotate.UUID), &cmd); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(cmd.Command.ReplyEncryptionCertificate, m.escrowCert.Raw) {
			t.Error("the reply certificate is not the one fvenable's profile carried before the restart: a new keypair")
		}
		drain(t, sender, c.mdm, m)
		if len(m.wrongPRK) > 0 {
			t.Fatalf("RotateFileVaultKey sent %q, not the escrowed PRK %s", m.wrongPRK, prk)
		}
		if got := c.inventory(t, m.id)["prk"]; got == prk || got != m.currentPRK() {
			t.Errorf("PRK after rotation %v, want the Mac's new one %s (was %s)", got, m.currentPRK(), prk)
		}
	})

	t.Run("idle not started since", func(t *testing.T) {
		c.mustCall(t, "PUT", "/v1/event/idle-devinfo", fmt.Appendf(nil, `{"event":"IdleNotStartedSince","workflow":%q,"event_context":"2"}`, wfDevInfoLog))
		m := newMac("IDLE-A")
		for i, want := range []int{1, 0, 1} {
			if i == 2 {
				time.Sleep(3 * time.Second) // more than the 2 s since the last start
			}
			if err := m.idle(sender); err != nil {
				t.Fatal(err)
			}
			if got := drain(t, sender, c.mdm, m); len(got[m.id]) != want {
				t.Errorf("idle %d: answered %v, want %d DeviceInformation", i+1, got[m.id], want)
			}
		}
	})

	t.Run("cancel on Authenticate", func(t *testing.T) {
		m := newMac("AUTH-A")
		c.start(t, wfLock, "", m)
		c.start(t, wfDevInfoLog, "", m)
		if p := m.pending(c.mdm); len(p) != 2 {
			t.Fatalf("pending %v, want DeviceLock and DeviceInformation", p)
		}
		if err := m.authenticate(sender); err != nil {
			t.Fatal(err)
		}
		testkit.WaitUntil(t, 15*time.Second, "AUTH-A's steps cancelled", func() (bool, any) {
			n := testkit.Count(t, c.db.DB, "SELECT COUNT(*) FROM id_commands WHERE enrollment_id = ?", m.id)
			return n == 0, n
		})
		drain(t, sender, c.mdm, m) // answered after the cancel: nobody's
		if inv := c.inventory(t, m.id); inv[wfLock+".received"] != nil {
			t.Errorf("a lock cancelled by Authenticate was completed: %v", inv)
		}
		c.start(t, wfLock, "", m) // not outstanding any more
		if got := drain(t, sender, c.mdm, m); !slices.Equal(got[m.id], []string{"DeviceLock"}) {
			t.Errorf("the lock started again: answered %v, want DeviceLock", got[m.id])
		}
		if inv := c.inventory(t, m.id); inv[wfLock+".received"] == nil {
			t.Errorf("the lock started again did not complete: %v", inv)
		}
	})
}

// noCommandEnqueuedTwice fails t if a command went to an enrollment more
// than once: NanoCMD enqueues each command once (re-pushes are pushes).
func (c *cluster) noCommandEnqueuedTwice(t *testing.T) {
	t.Helper()
	c.mdm.mu.Lock()
	defer c.mdm.mu.Unlock()
	for id, cmds := range c.mdm.cmds {
		seen := map[string]bool{}
		for _, e := range cmds {
			if seen[e.UUID] {
				t.Errorf("%s: %s (%s) enqueued more than once", id, e.UUID, e.RequestType)
			}
			seen[e.UUID] = true
		}
	}
	if len(c.mdm.bad) > 0 {
		t.Errorf("requests the fake NanoMDM refused: %v", c.mdm.bad)
	}
}

// Two replicas of the binary, started at once on one empty database, behind
// one URL, each request
// (NanoMDM's webhooks, the API) to the next replica: every workflow
// completes, and once (each Mac answered exactly the commands one run
// sends), both engine workers polling the same NotUntil steps send each
// once, and no step row is left.
func TestEveryWorkflowOnTwoReplicasBehindOneURL(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	c := startCluster(t, db, 2, "-worker-interval", "1")
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM subsystem_filevault_keypair"); n != 1 {
		t.Errorf("%d FileVault keypairs after two replicas started at once, want 1", n)
	}
	everyWorkflow(t, c, func(t *testing.T) { c.restart(t, 0); c.restart(t, 1) })
	c.noStepRowsLeft(t)
	c.noCommandEnqueuedTwice(t)
	for i, p := range c.procs {
		if !strings.Contains(p.Logs(), "path=/webhook") {
			t.Errorf("replica %d had no webhook since its restart: the proxy did not spread the requests", i)
		}
	}
}
