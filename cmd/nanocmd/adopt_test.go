package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	nanomysql "github.com/micromdm/nanocmd/engine/storage/mysql"
	"github.com/micromdm/nanocmd/mdm/foss"
	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// nanoCMDSchema loads NanoCMD v0.7.1's own schema.sql files (engine and
// profiles, as its operations guide has the operator load them) into db.
func nanoCMDSchema(t *testing.T, db *testkit.DB) {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/micromdm/nanocmd")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("locating NanoCMD v0.7.1: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	for _, f := range []string{"engine/storage/mysql/schema.sql", "subsystem/profile/storage/mysql/schema.sql"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range strings.Split(string(b), ";") {
			if strings.TrimSpace(q) == "" {
				continue
			}
			if _, err := db.Exec(q); err != nil {
				t.Fatalf("NanoCMD's %s: %v\n%s", f, err, q)
			}
		}
	}
}

// startNanoCMDv071 runs NanoCMD v0.7.1's own server, built from bench/,
// with -storage mysql on db and its commands enqueued to mdm.
func startNanoCMDv071(t *testing.T, db *testkit.DB, mdm *fakeNanoMDM) *cluster {
	t.Helper()
	addr := testkit.FreeAddr(t)
	c := &cluster{t: t, db: db, mdm: mdm, bin: buildNanoCMD(t), base: "http://" + addr, addrs: []string{addr}, procs: []*testkit.Proc{nil}}
	c.args = [][]string{{"-listen", addr, "-api", apiKey, "-enqueue-url", mdm.URL + "/v1/enqueue/", "-push-url", mdm.URL + "/v1/push/",
		"-enqueue-api", enqueueKey, "-storage", "mysql", "-storage-dsn", db.DSN}}
	c.startReplica(t, 0)
	return c
}

func isMariaDB(t *testing.T, db *testkit.DB) bool {
	var v string
	if err := db.QueryRow("SELECT VERSION()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return strings.Contains(v, "MariaDB")
}

// A database NanoCMD v0.7.1 created (its schema.sql) and used (its own
// server started workflows on it, some of their commands answered, their
// profiles and event subscriptions stored) is adopted by stepcollect's
// binary in place: the steps NanoCMD left in flight complete through it,
// with the results NanoCMD stored, NanoCMD's profile and subscription
// still in use, nothing enqueued twice, and no step row left.
//
// On MariaDB NanoCMD's own statements with `INSERT … AS new` fail (its
// workflow start answers 500 after its steps are stored and enqueued;
// profiles and subscriptions cannot be stored): its steps are adopted as
// far as it made them.
func TestANanoCMDv071DatabaseIsAdoptedWithItsStepsInFlight(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	nanoCMDSchema(t, db)
	mariaDB := isMariaDB(t, db)
	mdm := startFakeNanoMDM(t, enqueueKey)
	theirs := startNanoCMDv071(t, db, mdm)
	sender := theirs.sender()

	started := func(name, wfCtx string, macs ...*mac) {
		t.Helper()
		q := []string{}
		for _, m := range macs {
			q = append(q, "id="+m.id)
		}
		if wfCtx != "" {
			q = append(q, "context="+wfCtx)
		}
		code, body := theirs.call(t, "POST", "/v1/workflow/"+name+"/start?"+strings.Join(q, "&"), nil)
		if code != 200 && !(mariaDB && code == 500 && strings.Contains(string(body), "recording workflow status")) {
			t.Fatalf("NanoCMD v0.7.1 starting %s: %d %s", name, code, body)
		}
		for _, m := range macs {
			if len(m.pending(mdm)) == 0 {
				t.Fatalf("NanoCMD v0.7.1 enqueued nothing for %s (%s)", m.id, name)
			}
		}
	}

	// inventory: one Mac's DeviceInformation answered to NanoCMD, its
	// SecurityInfo left; another Mac's both left
	half, none := newMac("ADOPT-INV-HALF"), newMac("ADOPT-INV-NONE")
	started(wfInventory, "", half, none)
	answerOnly(t, sender, mdm, half, "DeviceInformation")
	lateLog := newMac("ADOPT-DEVINFO")
	started(wfDevInfoLog, "", lateLog)

	var listed, unlisted, enrolled *mac
	if !mariaDB {
		// profile: one Mac's ProfileList answered to NanoCMD (its
		// InstallProfile enqueued by NanoCMD), another's left
		theirs.mustCall(t, "PUT", "/v1/profile/wifi", mobileconfig("com.example.wifi", "WIFI-UUID-1", "Wi-Fi"))
		listed, unlisted = newMac("ADOPT-PROF-LISTED"), newMac("ADOPT-PROF-UNLISTED")
		started(wfProfile, "wifi", listed, unlisted)
		answerOnly(t, sender, mdm, listed, "ProfileList")
		if p := listed.pending(mdm); len(p) != 1 || p[0].RequestType != "InstallProfile" {
			t.Fatalf("%s pending %v after its ProfileList, want NanoCMD's InstallProfile", listed.id, p)
		}
		theirs.mustCall(t, "PUT", "/v1/event/enroll-log", []byte(`{"event":"Enrollment","workflow":"`+wfDevInfoLog+`"}`))
		enrolled = newMac("ADOPT-ENROLLED")
	}
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM steps"); n == 0 {
		t.Fatal("NanoCMD v0.7.1 left no steps in flight")
	}
	theirs.procs[0].Stop()

	ours := startClusterOn(t, db, mdm, 1, "-worker-interval", "1")
	sender = ours.sender()
	macs := []*mac{half, none, lateLog}
	if !mariaDB {
		macs = append(macs, listed, unlisted)
		if err := enrolled.enroll(ours.base + "/webhook"); err != nil {
			t.Fatal(err)
		}
		macs = append(macs, enrolled)
	}
	got := drain(t, sender, mdm, macs...)
	for _, m := range []*mac{half, none} {
		if inv := ours.inventory(t, m.id); inv["serial_number"] != "SN"+m.id || inv["sip_enabled"] != true {
			t.Errorf("%s: inventory %v, want DeviceInformation's and SecurityInfo's values (answered %v)", m.id, inv, got[m.id])
		}
	}
	wantLogged := []string{"UDID=ADOPT-DEVINFO, SerialNumber=SNADOPT-DEVINFO"}
	if !mariaDB {
		if !slices.Equal(got[listed.id], []string{"InstallProfile"}) || !slices.Equal(got[unlisted.id], []string{"ProfileList", "InstallProfile"}) {
			t.Errorf("answered to stepcollect: %s %v, %s %v; want NanoCMD's InstallProfile, and ProfileList then InstallProfile",
				listed.id, got[listed.id], unlisted.id, got[unlisted.id])
		}
		for _, m := range []*mac{listed, unlisted} {
			if want := []installedProfile{{"com.example.wifi", "WIFI-UUID-1"}}; !slices.Equal(m.profiles, want) {
				t.Errorf("%s has profiles %v, want NanoCMD's %v", m.id, m.profiles, want)
			}
		}
		if !slices.Equal(got[enrolled.id], []string{"DeviceInformation"}) {
			t.Errorf("%s, enrolled, answered %v: NanoCMD's subscription did not start devinfolog", enrolled.id, got[enrolled.id])
		}
		wantLogged = append(wantLogged, "UDID=ADOPT-ENROLLED, SerialNumber=SNADOPT-ENROLLED")
	}
	for _, w := range wantLogged {
		testkit.WaitUntil(t, 5*time.Second, w+" logged", func() (bool, any) { return strings.Contains(ours.logs(), w), nil })
	}
	ours.noStepRowsLeft(t)
	ours.noCommandEnqueuedTwice(t)
}

// answerOnly answers m's pending commands of requestType, and no other.
func answerOnly(t *testing.T, sender *webhook.Webhook, f *fakeNanoMDM, m *mac, requestType string) {
	t.Helper()
	n := 0
	for _, e := range m.pending(f) {
		if e.RequestType == requestType {
			if err := m.answer(sender, f, e); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatalf("%s: no %s pending", m.id, requestType)
	}
}

// deviceInformation is a DeviceInformation command plist, as devinfolog
// makes it.
func deviceInformation(uuid string) []byte {
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>Command</key><dict><key>Queries</key><array><string>UDID</string><string>SerialNumber</string></array>`+
		`<key>RequestType</key><string>DeviceInformation</string></dict><key>CommandUUID</key><string>%s</string></dict></plist>`, uuid)
}

// A NotUntil step NanoCMD v0.7.1's engine worker already sent (its
// storage marks it with a process_id and keeps its not_until) is not sent
// again by stepcollect's binary on the adopted database, and a NotUntil
// step NanoCMD stored but had not sent yet is sent once, when due; both
// complete through stepcollect.
func TestANotUntilStepNanoCMDsWorkerSentIsNotSentAgain(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	nanoCMDSchema(t, db)
	mdm := startFakeNanoMDM(t, enqueueKey)
	theirs, err := nanomysql.New(nanomysql.WithDSN(db.DSN))
	if err != nil {
		t.Fatal(err)
	}
	enq, err := foss.NewFossMDM(mdm.URL+"/v1/enqueue/", enqueueKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	sent, waiting := newMac("NOTUNTIL-SENT"), newMac("NOTUNTIL-WAITING")
	for _, s := range []struct {
		m        *mac
		notUntil time.Time
	}{{sent, time.Now().Add(-time.Minute)}, {waiting, time.Now().Add(2 * time.Minute)}} {
		uuid := "CMD-" + s.m.id
		err := theirs.StoreStep(ctx, &nanostorage.StepEnqueuingWithConfig{
			StepEnqueueing: nanostorage.StepEnqueueing{
				StepContext: nanostorage.StepContext{WorkflowName: wfDevInfoLog, InstanceID: "INSTANCE-" + s.m.id},
				IDs:         []string{s.m.id},
				Commands:    []nanostorage.StepCommandRaw{{CommandUUID: uuid, RequestType: "DeviceInformation", Command: deviceInformation(uuid)}},
			},
			NotUntil: s.notUntil,
		}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
	}
	// NanoCMD's engine worker's run: the due step claimed and enqueued
	due, err := theirs.RetrieveStepsToEnqueue(ctx, time.Now())
	if err != nil || len(due) != 1 {
		t.Fatalf("NanoCMD's worker found %d due steps (%v), want the one", len(due), err)
	}
	for _, c := range due[0].Commands {
		if err := enq.Enqueue(ctx, due[0].IDs, c.Command); err != nil {
			t.Fatal(err)
		}
	}
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM steps WHERE process_id IS NOT NULL AND not_until IS NOT NULL"); n != 1 {
		t.Fatalf("%d steps marked sent by NanoCMD's process_id, want 1", n)
	}

	ours := startClusterOn(t, db, mdm, 1, "-worker-interval", "1")
	time.Sleep(3 * time.Second) // three runs of the engine worker
	if p := sent.pending(mdm); len(p) != 1 {
		t.Errorf("%s: %v enqueued, want NanoCMD's one DeviceInformation", sent.id, p)
	}
	if p := waiting.pending(mdm); len(p) != 0 {
		t.Errorf("%s: %v enqueued before its NotUntil", waiting.id, p)
	}
	ours.passNotUntil(t)
	ours.waitForCommand(t, waiting, "DeviceInformation", 15*time.Second)
	drain(t, ours.sender(), mdm, sent, waiting)
	for _, m := range []*mac{sent, waiting} {
		w := "UDID=" + m.id + ", SerialNumber=SN" + m.id
		testkit.WaitUntil(t, 5*time.Second, w+" logged", func() (bool, any) { return strings.Contains(ours.logs(), w), nil })
	}
	ours.noStepRowsLeft(t)
	ours.noCommandEnqueuedTwice(t)
}
