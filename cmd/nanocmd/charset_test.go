package main_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// emojiName is a DeviceName with a 4-byte character, which utf8mb3 and
// latin1 columns cannot hold.
const emojiName = "Anna’s Mac 💻"

// On a database whose default character set is not utf8mb4 (an older
// one), fresh or adopted from NanoCMD with the subsystem tables an older
// build made in that character set: a DeviceInformation result with an
// emoji in its DeviceName is answered 200 and its values are in the
// inventory, a profile with one is stored, and what the converted tables
// held before is kept.
func TestAnEmojiIsStoredOnADatabaseWhoseDefaultIsNotUTF8MB4(t *testing.T) {
	for _, charset := range []string{"utf8mb3", "latin1"} {
		for _, adopted := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s, adopted %v", charset, adopted), func(t *testing.T) {
				db := testkit.NewDB(t, &testkit.DBOptions{Empty: true, Charset: charset})
				if adopted {
					nanoCMDSchema(t, db)
					olderSubsystemTables(t, db)
				}
				c := startCluster(t, db, 1)
				m := newMac("EMOJI-" + charset)
				m.name = emojiName
				c.start(t, wfInventory, "", m)
				drain(t, c.sender(), c.mdm, m) // fails on a non-200
				inv := c.inventory(t, m.id)
				if inv["device_name"] != emojiName || inv["serial_number"] != "SN"+m.id || inv["model"] != "Mac14,2" {
					t.Errorf("inventory %v, want the device name %q, its serial and model", inv, emojiName)
				}
				profile := mobileconfig("com.example.emoji", "EMOJI-UUID-1", "Wi-Fi 📶")
				c.mustCall(t, "PUT", "/v1/profile/emoji", profile)
				if got := c.mustCall(t, "GET", "/v1/profile/emoji", nil); !strings.Contains(string(got), "Wi-Fi 📶") {
					t.Errorf("the profile read back: %s, want its display name Wi-Fi 📶", got)
				}
				if adopted {
					if inv := c.inventory(t, "OLDER-1"); inv["device_name"] != "Mac é" {
						t.Errorf("a value stored before the conversion: %v, want device_name Mac é", inv)
					}
					if got := c.mustCall(t, "GET", "/v1/profile/older", nil); !strings.Contains(string(got), "Café ☕") {
						t.Errorf("a profile stored before the conversion: %s, want its display name Café ☕", got)
					}
				}
				// NanoCMD's engine tables of an adopted database are left
				// as they are (their ids are NanoCMD's); goose's version
				// tables hold numbers
				q := `SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_TYPE = 'BASE TABLE'
					AND TABLE_COLLATION NOT LIKE 'utf8mb4%' AND TABLE_NAME NOT LIKE '%migrations'`
				if adopted {
					q += ` AND TABLE_NAME NOT IN ('steps', 'id_commands', 'step_commands', 'wf_events', 'wf_status')`
				}
				if n := testkit.Count(t, db.DB, q); n != 0 {
					names := testkit.Column[string](t, db.DB, strings.Replace(q, "COUNT(*)", "CONCAT(TABLE_NAME, ' ', TABLE_COLLATION)", 1))
					t.Errorf("tables not in utf8mb4: %v", names)
				}
			})
		}
	}
}

// olderSubsystemTables creates the subsystem tables an older build made
// in the database's default character set, with values in them.
func olderSubsystemTables(t *testing.T, db *testkit.DB) {
	t.Helper()
	for _, q := range []string{
		`CREATE TABLE subsystem_inventory (enrollment_id VARCHAR(255) NOT NULL, inventory MEDIUMTEXT NOT NULL,
			created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
			PRIMARY KEY (enrollment_id))`,
		`CREATE TABLE subsystem_cmdplans (name VARCHAR(255) NOT NULL, cmdplan MEDIUMTEXT NOT NULL,
			created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,
			PRIMARY KEY (name))`,
		`INSERT INTO subsystem_inventory (enrollment_id, inventory) VALUES ('OLDER-1', '{"device_name":"Mac é"}')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// as NanoCMD writes a profile: its bytes (UTF-8, in a latin1 column too)
	if _, err := db.Exec(`INSERT INTO subsystem_profiles (name, profile_id, profile_uuid, raw_profile) VALUES ('older', 'com.example.older', 'OLDER-UUID', ?)`,
		mobileconfig("com.example.older", "OLDER-UUID", "Café ☕")); err != nil {
		t.Fatal(err)
	}
}

// On a database NanoCMD made in utf8mb3, whose engine tables are kept as
// they are, an emoji in a webhook's enrollment id or command UUID is a
// command no workflow sent (200), an Authenticate from such an id cancels
// nothing (200), and a start for it is a 400: MariaDB's error 1267 (illegal
// mix of collations) was a 500.
func TestAnEmojiIDOnAnAdoptedUTF8MB3DatabaseIsNoServerError(t *testing.T) {
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true, Charset: "utf8mb3"})
	nanoCMDSchema(t, db)
	c := startCluster(t, db, 1)
	sender := c.sender()
	for _, k := range []struct{ id, uuid string }{{"DEV-💻", "U-1"}, {"DEV-1", "U-💻"}} {
		if err := answer(sender, k.id, enqueued{k.uuid, "DeviceInformation"}); err != nil {
			t.Errorf("a result of %s for %s: %v, want 200", k.id, k.uuid, err)
		}
	}
	if err := newMac("AUTH-💻").authenticate(sender); err != nil {
		t.Errorf("an Authenticate from AUTH-💻: %v, want 200", err)
	}
	code, body := c.call(t, "POST", "/v1/workflow/"+wfInventory+"/start?id=START-%F0%9F%92%BB", nil)
	if code != http.StatusBadRequest || strings.Contains(string(body), "`") {
		t.Errorf("a start for START-💻: %d %s, want a 400 naming nothing of the schema", code, body)
	}
}
