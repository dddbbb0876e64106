package main_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

// loadSQL runs the ;-separated statements of file in db.
func loadSQL(t *testing.T, db *testkit.DB, file string) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	for q := range strings.SplitSeq(string(b), ";") {
		if strings.TrimSpace(q) == "" {
			continue
		}
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v\n%s", file, err, q)
		}
	}
}

// nanoHUBv020Database is a database as NanoHUB v0.2.0's operations guide
// has the operator make it: NanoMDM's, NanoCMD's (engine, and profiles,
// which its -storage mysql uses) and KMFDDM's schema.sql loaded by hand.
func nanoHUBv020Database(t *testing.T) *testkit.DB {
	t.Helper()
	db := nanomdm.NewMySQLDB(t) // NanoMDM's schema; skipped on MariaDB
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatal(err)
	}
	nanocmd := filepath.Join(strings.TrimSpace(string(out)), "github.com/micromdm/nanocmd@v0.7.0")
	loadSQL(t, db, filepath.Join(nanocmd, "engine/storage/mysql/schema.sql"))
	loadSQL(t, db, filepath.Join(nanocmd, "subsystem/profile/storage/mysql/schema.sql"))
	loadSQL(t, db, "../../nanohubapp/kmfddm_schema.sql") // KMFDDM v0.8.3's, unchanged
	return db
}

// A database NanoHUB v0.2.0 ran on, taken over by this binary on the same
// address: the Macs enrolled under v0.2.0 carry on without enrolling again
// (NanoMDM's enrollments and certificate associations are kept), the
// profile uploaded through v0.2.0's API is served, a devinfolog step
// v0.2.0 left in flight is answered and completed here, a declaration is
// stored, and the inventory workflow (which v0.2.0 does not register with
// -storage mysql) reaches every Mac.
func TestANanoHUBv020DatabaseIsAdoptedInPlace(t *testing.T) {
	db := nanoHUBv020Database(t)
	ca, err := nanomdm.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caPath, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testkit.FreeAddr(t)
	args := []string{"-listen", addr, "-storage", "mysql", "-storage-dsn", db.DSN, "-ca", caPath, "-cert-header", certHeader, "-api-key", apiKey}
	h := &hub{db: db, ca: ca, base: "http://" + addr}
	h.proc = testkit.StartProc(t, buildNanoHUB(t), nil, args...)
	testkit.AwaitHTTP(t, h.proc, h.base+"/version", 60*time.Second)

	// the Macs poll only when woken, so that none polls a stopped server
	h.fleet, err = mdmsim.NewFleet(ca, mdmsim.Target{MDMURL: h.base + "/mdm", CertHeader: certHeader},
		mdmsim.FleetConfig{N: 20, PollEvery: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := h.fleet.Enroll(ctx); err != nil {
		cancel()
		t.Fatalf("enrolling with v0.2.0: %v\n%s", err, h.proc.Logs())
	}
	done := make(chan struct{})
	go func() { defer close(done); h.fleet.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	h.mustAPI(t, http.MethodPut, "/api/v1/nanocmd/profile/wifi", mobileconfig("com.example.wifi", "WIFI-UUID-1", "Wi-Fi"))
	if code, body := h.start(t, inventory, "", h.fleet.IDs()...); code != http.StatusInternalServerError || !strings.Contains(string(body), "no such workflow") {
		t.Errorf("v0.2.0 answered the inventory's start %d %s, want its 500 no such workflow", code, body)
	}
	// a step v0.2.0 stored and enqueued, though it answered the start 500
	// for the failed push: in flight across the change of binary
	if code, body := h.start(t, wfDevInfoLog, "", h.fleet.IDs()...); code != http.StatusInternalServerError {
		t.Errorf("v0.2.0 answered devinfolog's start %d %s, want its 500 for the push", code, body)
	}
	if n := testkit.CountStepRows(t, db.DB).IDCommands; n != len(h.fleet.IDs()) {
		t.Fatalf("v0.2.0 left %d id_commands rows, want one per Mac", n)
	}
	h.proc.Stop() // v0.2.0 has no graceful stop: "signal: terminated"

	h.proc = testkit.StartProc(t, bins["nanohub"], nil, args...)
	testkit.AwaitHTTP(t, h.proc, h.base+"/readyz", 60*time.Second)
	if b := h.mustAPI(t, http.MethodGet, "/api/v1/nanocmd/profile/wifi", nil); !strings.Contains(string(b), "WIFI-UUID-1") {
		t.Errorf("the profile uploaded through v0.2.0: %s", b)
	}
	// KMFDDM's storage stores a declaration here (v0.2.0's cannot on a
	// MySQL without SHA1(), as 9.7's Debian build)
	h.mustAPI(t, http.MethodPut, "/api/v1/ddm/declarations", []byte(`{"Type":"com.apple.configuration.management.test","Identifier":"com.example.test","Payload":{"Echo":"adopted"}}`))
	if b := h.mustAPI(t, http.MethodGet, "/api/v1/ddm/declarations/com.example.test", nil); !strings.Contains(string(b), "adopted") {
		t.Errorf("the declaration uploaded through v0.2.0: %s", b)
	}
	ids := h.fleet.IDs()
	h.mustStart(t, inventory, "", ids...)
	h.fleet.Wake()
	got := 0
	if _, ok := testkit.Watch(time.Now().Add(time.Minute), func() bool {
		if got = h.inventoried(t, ids); got < len(ids) {
			h.fleet.Wake() // the step's second command, for whoever answered the first
		}
		return got == len(ids)
	}); !ok {
		t.Fatalf("%d of %d Macs enrolled under v0.2.0 inventoried; devices: %v %v\n%s", got, len(ids), h.fleet.Progress(), h.fleet.Errors(), tail(h.proc.Logs()))
	}
	for _, d := range h.fleet.Devices() {
		if types, _ := answered(d); !slices.Contains(types, "DeviceInformation") {
			t.Errorf("%s did not answer the DeviceInformation v0.2.0 queued: %v", d.UDID, types)
		}
	}
	testkit.WaitUntil(t, 30*time.Second, "no step row left", func() (bool, any) {
		rows := testkit.CountStepRows(t, h.db.DB)
		return rows == testkit.StepRows{}, rows
	})
}
