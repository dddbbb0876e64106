package nanomdm_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

const hmacKey = "webhook-secret"

// bundle is a NanoMDM server, the recorder of its webhook, and devices
// enrolled in it.
type bundle struct {
	srv     *nanomdm.Server
	hook    *nanomdm.Webhook
	devices []*mdmsim.Device
}

func setup(t *testing.T, o nanomdm.Options, devices ...string) *bundle {
	t.Helper()
	b := &bundle{hook: nanomdm.NewWebhook(t, hmacKey)}
	o.WebhookURL, o.HMACKey = b.hook.URL, hmacKey
	b.srv = nanomdm.Start(t, o)
	for _, udid := range devices {
		d, err := mdmsim.NewDevice(b.srv.CA, mdmsim.Target{MDMURL: b.srv.MDMURL, CertHeader: b.srv.CertHeader}, udid, mdmsim.Behavior{})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Enroll(context.Background()); err != nil {
			t.Fatalf("enrolling %s: %v\n%s", udid, err, b.srv.Logs())
		}
		b.devices = append(b.devices, d)
	}
	return b
}

func deviceInformation(uuid string) []byte {
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict><key>Command</key><dict><key>RequestType</key><string>DeviceInformation</string>
<key>Queries</key><array><string>SerialNumber</string><string>Model</string></array></dict>
<key>CommandUUID</key><string>%s</string></dict></plist>`, uuid)
}

// enqueue enqueues a DeviceInformation command uuid to ids and returns
// NanoMDM's answer.
func (b *bundle) enqueue(t *testing.T, uuid string, ids ...string) *nanomdm.APIResult {
	t.Helper()
	r, err := b.srv.Enqueue(context.Background(), deviceInformation(uuid), ids...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// poll has device i poll once and returns how many commands it answered.
func (b *bundle) poll(t *testing.T, i int) int {
	t.Helper()
	n, err := b.devices[i].Poll(context.Background())
	if err != nil {
		t.Fatalf("%s polling: %v\n%s", b.devices[i].UDID, err, b.srv.Logs())
	}
	return n
}

// awaitAck waits for NanoMDM's webhook post of udid's report of uuid.
func (b *bundle) awaitAck(t *testing.T, udid, uuid, status string) {
	t.Helper()
	testkit.WaitUntil(t, 10*time.Second, "the webhook post of "+udid+"'s "+status+" to "+uuid, func() (bool, any) {
		acks := b.hook.AcksOf(uuid)[udid]
		return len(acks) > 0 && acks[len(acks)-1].Status == status, b.hook.Topics()
	})
}

var kvStorages = []string{"inmem", "filekv"}

// With no APNs certificate NanoMDM's enqueue API answers 500 with a
// top-level push_error (and no command_error): the command is enqueued
// all the same, and the device gets it at its next poll. On every file
// storage too.
func TestAnEnqueueAnswers500ForThePushYetTheCommandIsQueued(t *testing.T) {
	t.Parallel()
	for _, storage := range []string{"inmem", "filekv", "file"} {
		t.Run(storage, func(t *testing.T) {
			b := setup(t, nanomdm.Options{Storage: storage}, "PUSHLESS-1")
			r := b.enqueue(t, "CMD-PUSHLESS", "PUSHLESS-1")
			if r.HTTPStatus != 500 || r.PushError == nil || r.EnqueueError != nil || r.CommandUUID != "CMD-PUSHLESS" {
				t.Fatalf("enqueue answered %d %s, want 500 with a push_error, no command_error, the command's uuid", r.HTTPStatus, r.Body)
			}
			if want := `retrieving push cert for topic "` + mdmsim.DefaultTopic + `"`; !strings.HasPrefix(r.PushError.Error(), want) {
				t.Errorf("push_error %q, want it to start %q", r.PushError, want)
			}
			if n := b.poll(t, 0); n != 1 {
				t.Fatalf("the device answered %d commands, want the one enqueued", n)
			}
			b.awaitAck(t, "PUSHLESS-1", "CMD-PUSHLESS", "Acknowledged")

			// ?nopush=1 skips the push: 200, no_push
			r, err := b.srv.EnqueueNoPush(context.Background(), deviceInformation("CMD-NOPUSH"), "PUSHLESS-1")
			if err != nil || r.HTTPStatus != 200 || !r.NoPush || r.PushError != nil || r.EnqueueError != nil {
				t.Errorf("enqueue with nopush answered %v %d %s, want 200 with no_push", err, r.HTTPStatus, r.Body)
			}
		})
	}
}

// NanoMDM's key-value storages (inmem, filekv) refuse a CommandUUID they
// already hold, whatever ids the second request names: 500, a
// command_error "command already exists: <uuid>", no push tried, and the
// other device never gets it. The deprecated file storage accepts it.
func TestADuplicateCommandUUIDIsRefused(t *testing.T) {
	t.Parallel()
	for _, storage := range kvStorages {
		t.Run(storage, func(t *testing.T) {
			b := setup(t, nanomdm.Options{Storage: storage}, "DUP-1", "DUP-2")
			if r := b.enqueue(t, "CMD-DUP", "DUP-1"); r.HTTPStatus != 500 || r.EnqueueError != nil {
				t.Fatalf("first enqueue answered %d %s, want 500 for the push only", r.HTTPStatus, r.Body)
			}
			for _, ids := range [][]string{{"DUP-2"}, {"DUP-1"}, {"DUP-1", "DUP-2"}} {
				r := b.enqueue(t, "CMD-DUP", ids...)
				if r.HTTPStatus != 500 || r.EnqueueError == nil || r.EnqueueError.Error() != "command already exists: CMD-DUP" ||
					r.PushError != nil || len(r.Status) != 0 || r.CommandUUID != "CMD-DUP" {
					t.Errorf("enqueue again to %v answered %d %s, want 500 with command_error \"command already exists: CMD-DUP\" only", ids, r.HTTPStatus, r.Body)
				}
			}
			b.poll(t, 0)
			if n := b.poll(t, 1); n != 0 {
				t.Errorf("the second device answered %d commands, want none: the duplicate was refused", n)
			}
			if got := b.devices[0].Answers("CMD-DUP"); len(got) != 1 {
				t.Errorf("the first device answered the command %v, want once", got)
			}
		})
	}
	t.Run("file", func(t *testing.T) {
		b := setup(t, nanomdm.Options{Storage: "file"}, "DUP-1", "DUP-2")
		b.enqueue(t, "CMD-DUP", "DUP-1")
		if r := b.enqueue(t, "CMD-DUP", "DUP-2"); r.HTTPStatus != 500 || r.EnqueueError != nil || r.PushError == nil {
			t.Fatalf("enqueue again answered %d %s, want it taken (500 for the push only)", r.HTTPStatus, r.Body)
		}
		if n := b.poll(t, 0) + b.poll(t, 1); n != 2 {
			t.Errorf("the devices answered %d commands, want the command once each", n)
		}
	})
}

// An id NanoMDM does not know gets the command queued all the same: 500
// with no top-level error, only that id's push_error "push data missing
// for id". The uuid is then taken: enqueueing it to an enrolled device is
// refused.
func TestAnEnqueueToAnUnknownIDIsAPushErrorOfThatID(t *testing.T) {
	t.Parallel()
	for _, storage := range kvStorages {
		t.Run(storage, func(t *testing.T) {
			b := setup(t, nanomdm.Options{Storage: storage}, "KNOWN-1")
			r := b.enqueue(t, "CMD-UNKNOWN", "NO-SUCH-DEVICE")
			st := r.Status["NO-SUCH-DEVICE"]
			if r.HTTPStatus != 500 || r.PushError != nil || r.EnqueueError != nil || st.PushError == nil ||
				st.PushError.Error() != "push data missing for id" || st.EnqueueError != nil {
				t.Fatalf("enqueue to an unknown id answered %d %s, want 500 with that id's push_error \"push data missing for id\" only", r.HTTPStatus, r.Body)
			}
			if r := b.enqueue(t, "CMD-UNKNOWN", "KNOWN-1"); r.EnqueueError == nil {
				t.Errorf("the same uuid to an enrolled device answered %d %s, want it refused as a duplicate", r.HTTPStatus, r.Body)
			}

			// an enrolled and an unknown id: both errors
			r = b.enqueue(t, "CMD-MIXED", "KNOWN-1", "NO-SUCH-DEVICE")
			if r.HTTPStatus != 500 || r.PushError == nil || r.Status["NO-SUCH-DEVICE"].PushError == nil {
				t.Errorf("enqueue to an enrolled and an unknown id answered %d %s, want 500 with both push errors", r.HTTPStatus, r.Body)
			}
			if n := b.poll(t, 0); n != 1 {
				t.Errorf("the enrolled device answered %d commands, want CMD-MIXED", n)
			}
		})
	}
}

// A request without the identity certificate is refused before NanoMDM
// reads it, and one with a certificate of another CA too.
func TestADeviceWithoutAnIdentityFromTheCAIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, nanomdm.Options{})
	other, err := nanomdm.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	for name, target := range map[string]struct {
		issuer mdmsim.Issuer
		header string
	}{"no header": {b.srv.CA, ""}, "another CA": {other, b.srv.CertHeader}} {
		d, err := mdmsim.NewDevice(target.issuer, mdmsim.Target{MDMURL: b.srv.MDMURL, CertHeader: target.header}, "REFUSED-1", mdmsim.Behavior{})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Enroll(context.Background()); err == nil || !strings.Contains(err.Error(), "400 Bad Request") {
			t.Errorf("%s: enrolling: %v, want 400 Bad Request", name, err)
		}
	}
	if n := len(b.hook.Events()); n != 0 {
		t.Errorf("NanoMDM posted %d events for refused requests", n)
	}
}

// NanoMDM on its MySQL storage, its schema loaded by LoadSchema: a
// device enrolls and answers a command, and a duplicate uuid is refused.
func TestNanoMDMRunsOnMySQL(t *testing.T) {
	t.Parallel()
	db := nanomdm.NewMySQLDB(t)
	b := setup(t, nanomdm.Options{Storage: "mysql", DSN: db.DSN}, "MYSQL-1", "MYSQL-2")
	if r := b.enqueue(t, "CMD-MYSQL", "MYSQL-1"); r.HTTPStatus != 500 || r.EnqueueError != nil || r.PushError == nil {
		t.Fatalf("enqueue answered %d %s, want 500 for the push only", r.HTTPStatus, r.Body)
	}
	r := b.enqueue(t, "CMD-MYSQL", "MYSQL-2")
	t.Logf("a duplicate uuid on MySQL: %d %s", r.HTTPStatus, r.Body)
	if r.HTTPStatus != 500 || r.EnqueueError == nil {
		t.Errorf("enqueue again answered %d %s, want it refused", r.HTTPStatus, r.Body)
	}
	if n := b.poll(t, 0); n != 1 {
		t.Fatalf("the device answered %d commands, want 1", n)
	}
	b.awaitAck(t, "MYSQL-1", "CMD-MYSQL", "Acknowledged")
	if n := testkit.Count(t, db.DB, `SELECT COUNT(*) FROM command_results WHERE command_uuid = 'CMD-MYSQL'`); n != 1 {
		t.Errorf("command_results holds %d rows of the command, want 1", n)
	}
}

func securityInfo(uuid string) []byte {
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict><key>Command</key><dict><key>RequestType</key><string>SecurityInfo</string></dict>
<key>CommandUUID</key><string>%s</string></dict></plist>`, uuid)
}

// On the key-value storages a command answered NotNow is lost once the
// command queued after it is answered: NanoMDM's queue unlinks the last
// command without clearing its predecessor's link to it, so that it hands
// the answered command out again after the NotNow one, and unlinking it a
// second time empties the queue. Here the device answers the first
// command NotNow twice: it never gets it a third time, and answers the
// second twice. On MySQL the first is handed out until answered.
func TestANotNowCommandIsLostWhenTheNextIsAnswered(t *testing.T) {
	t.Parallel()
	for _, storage := range append(kvStorages, "mysql") {
		t.Run(storage, func(t *testing.T) {
			o := nanomdm.Options{Storage: storage}
			if storage == "mysql" {
				o.DSN = nanomdm.NewMySQLDB(t).DSN
			}
			b := setup(t, o)
			d, err := mdmsim.NewDevice(b.srv.CA, mdmsim.Target{MDMURL: b.srv.MDMURL, CertHeader: b.srv.CertHeader}, "NOTNOW-1",
				mdmsim.Behavior{NotNow: map[string]int{"DeviceInformation": 2}})
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Enroll(context.Background()); err != nil {
				t.Fatal(err)
			}
			b.enqueue(t, "CMD-FIRST", d.UDID)
			if r, err := b.srv.Enqueue(context.Background(), securityInfo("CMD-SECOND"), d.UDID); err != nil || r.EnqueueError != nil {
				t.Fatalf("enqueueing CMD-SECOND: %v %s", err, r.Body)
			}
			for range 3 {
				if _, err := d.Poll(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			first, second := d.Answers("CMD-FIRST"), d.Answers("CMD-SECOND")
			t.Logf("%s: the first command answered %v, the second %v", storage, first, second)
			want := [2][]string{{"NotNow", "NotNow"}, {"Acknowledged", "Acknowledged"}}
			if storage == "mysql" {
				want = [2][]string{{"NotNow", "NotNow", "Acknowledged"}, {"Acknowledged"}}
			}
			if !slices.Equal(first, want[0]) || !slices.Equal(second, want[1]) {
				t.Errorf("the first command answered %v, the second %v; want %v and %v", first, second, want[0], want[1])
			}
		})
	}
}
