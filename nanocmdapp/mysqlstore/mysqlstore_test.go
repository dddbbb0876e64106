package mysqlstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	cmdplanstorage "github.com/micromdm/nanocmd/subsystem/cmdplan/storage"
	cmdplantest "github.com/micromdm/nanocmd/subsystem/cmdplan/storage/test"
	"github.com/micromdm/nanocmd/subsystem/filevault/storage/invprk"
	invstorage "github.com/micromdm/nanocmd/subsystem/inventory/storage"
	invtest "github.com/micromdm/nanocmd/subsystem/inventory/storage/test"
	profstorage "github.com/micromdm/nanocmd/subsystem/profile/storage"
	proftest "github.com/micromdm/nanocmd/subsystem/profile/storage/test"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/nanocmdapp/mysqlstore"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

func setup(t *testing.T) *testkit.DB {
	t.Helper()
	db := testkit.NewDB(t, nil)
	if err := mysqlstore.Migrate(t.Context(), db.DB); err != nil {
		t.Fatal(err)
	}
	return db
}

// NanoCMD's own behavioural suites pass on the MySQL backends.
func TestNanoCMDsStorageSuitesPass(t *testing.T) {
	t.Parallel()
	db := setup(t)
	t.Run("profile", func(t *testing.T) {
		proftest.TestProfileStorage(t, func() (profstorage.Storage, error) { return mysqlstore.NewProfiles(db.DB), nil })
	})
	t.Run("inventory", func(t *testing.T) {
		invtest.TestStorage(t, func() invstorage.Storage { return mysqlstore.NewInventory(db.DB) })
	})
	t.Run("cmdplan", func(t *testing.T) {
		cmdplantest.TestCMDPlanStorage(t, func() cmdplanstorage.Storage { return mysqlstore.NewCMDPlans(db.DB) })
	})
}

// A profile stored again replaces the first, on MariaDB as on MySQL (no
// `INSERT … AS new`, which MariaDB refuses with 1064).
func TestAProfileStoredTwiceIsReplaced(t *testing.T) {
	t.Parallel()
	db := setup(t)
	s := mysqlstore.NewProfiles(db.DB)
	ctx := t.Context()
	for _, uuid := range []string{"U-1", "U-2"} {
		if err := s.StoreProfile(ctx, "p", profstorage.ProfileInfo{Identifier: "com.example", UUID: uuid}, []byte("raw-"+uuid)); err != nil {
			t.Fatal(err)
		}
	}
	infos, err := s.RetrieveProfileInfos(ctx, []string{"p"})
	if err != nil || infos["p"].UUID != "U-2" {
		t.Fatalf("after two stores: %v, %v; want UUID U-2", infos, err)
	}
	if err := s.DeleteProfile(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	// as NanoCMD's own storages: deleting what is not there is no error
	// (its DELETE /v1/profile/{name} answers 204)
	if err := s.DeleteProfile(ctx, "p"); err != nil {
		t.Errorf("deleting a deleted profile: %v, want nil", err)
	}
	if infos, err := s.RetrieveProfileInfos(ctx, []string{"p"}); !errors.Is(err, profstorage.ErrProfileNotFound) {
		t.Errorf("after the delete: %v, %v; want ErrProfileNotFound", infos, err)
	}
}

// A database NanoCMD v0.7.1 made (its schema.sql loaded by hand, a profile
// stored by it) keeps its profiles: Migrate adopts the table as it is.
func TestANanoCMDDatabasesProfilesCarryOver(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	ctx := t.Context()
	for _, q := range []string{
		"CREATE TABLE subsystem_profiles (name VARCHAR(255) NOT NULL, profile_id VARCHAR(255) NOT NULL, profile_uuid VARCHAR(255) NOT NULL, raw_profile MEDIUMTEXT NOT NULL, created_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP, updated_at TIMESTAMP DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, PRIMARY KEY (name))",
		"INSERT INTO subsystem_profiles (name, profile_id, profile_uuid, raw_profile) VALUES ('old', 'com.example.old', 'OLD-UUID', 'old raw')",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	if err := stepmysql.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	if err := mysqlstore.Migrate(ctx, db.DB); err != nil {
		t.Fatal(err)
	}
	raws, err := mysqlstore.NewProfiles(db.DB).RetrieveRawProfiles(ctx, []string{"old"})
	if err != nil || string(raws["old"]) != "old raw" {
		t.Fatalf("NanoCMD's profile after adoption: %q, %v", raws["old"], err)
	}
}

// Merges of different keys into one enrollment's inventory from two pools
// at once (two replicas) all survive, both ways a merge is made (one
// upsert of flat values, and the locked read-merge-write of values holding
// an object): each reads and writes under the row's lock. With a read
// outside the lock, most are lost.
func TestConcurrentInventoryMergesFromTwoReplicasLoseNothing(t *testing.T) {
	t.Parallel()
	db := setup(t)
	other, err := stepmysql.OpenDB(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	replicas := []*mysqlstore.Inventory{mysqlstore.NewInventory(db.DB), mysqlstore.NewInventory(other)}
	const merges = 40
	var wg sync.WaitGroup
	errs := make(chan error, merges)
	for i := range merges {
		wg.Go(func() {
			// half the merges start on an enrollment with no row yet; every
			// third holds an object
			var v any = i
			if i%3 == 0 {
				v = map[string]any{"n": i}
			}
			errs <- replicas[i%2].StoreInventoryValues(context.Background(), "DEV-1", invstorage.Values{fmt.Sprintf("k%d", i): v})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := replicas[0].RetrieveInventory(t.Context(), &invstorage.SearchOptions{IDs: []string{"DEV-1", "DEV-NONE"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got["DEV-1"]) != merges {
		t.Errorf("%d of %d merged keys survived: %v", len(got["DEV-1"]), merges, got["DEV-1"])
	}
	if _, ok := got["DEV-NONE"]; ok {
		t.Error("an enrollment without inventory is in the answer")
	}
}

// A merge replaces each top-level key it names, whatever its value: an
// object is not merged into the stored one, a null is stored, not a
// deletion (as NanoCMD's own backends merge), and the other keys stay.
func TestAnInventoryMergeReplacesTheKeysItNames(t *testing.T) {
	t.Parallel()
	db := setup(t)
	inv := mysqlstore.NewInventory(db.DB)
	ctx := t.Context()
	for _, v := range []invstorage.Values{
		{"serial_number": "SN1", "obj": map[string]any{"x": 1.0}, "gone": "soon", "sip_enabled": false},
		{"obj": map[string]any{"y": 2.0}, "gone": nil, "sip_enabled": true, "modified": time.Unix(1700000000, 0).UTC()},
		{"os_version": "14.4"},
	} {
		if err := inv.StoreInventoryValues(ctx, "DEV-R", v); err != nil {
			t.Fatal(err)
		}
	}
	got, err := inv.RetrieveInventory(ctx, &invstorage.SearchOptions{IDs: []string{"DEV-R"}})
	if err != nil {
		t.Fatal(err)
	}
	want := invstorage.Values{"serial_number": "SN1", "obj": map[string]any{"y": 2.0}, "gone": nil, "sip_enabled": true,
		"modified": "2023-11-14T22:13:20Z", "os_version": "14.4"}
	if !reflect.DeepEqual(got["DEV-R"], want) {
		t.Errorf("merged inventory:\n got %v\nwant %v", got["DEV-R"], want)
	}
}

// Replicas starting at the same moment, and a restart after them, all use
// one keypair: the one the first insert stored.
func TestEveryReplicaAndRestartUsesTheSameFileVaultKeypair(t *testing.T) {
	t.Parallel()
	db := setup(t)
	inv := mysqlstore.NewInventory(db.DB)
	const replicas = 4
	certs := make([][]byte, replicas+1)
	var wg sync.WaitGroup
	for i := range replicas {
		wg.Go(func() {
			fv, err := mysqlstore.NewFileVault(context.Background(), db.DB, invprk.NewInvPRK(inv))
			if err != nil {
				t.Error(err)
				return
			}
			certs[i], _ = fv.RetrievePRKCertRaw(context.Background(), "DEV-1")
		})
	}
	wg.Wait()
	fv, err := mysqlstore.NewFileVault(t.Context(), db.DB, invprk.NewInvPRK(inv)) // the restart
	if err != nil {
		t.Fatal(err)
	}
	certs[replicas], _ = fv.RetrievePRKCertRaw(t.Context(), "DEV-1")
	for i, c := range certs {
		if len(c) == 0 || string(c) != string(certs[0]) {
			t.Fatalf("process %d has a certificate of its own (%d bytes)", i, len(c))
		}
	}
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM subsystem_filevault_keypair"); n != 1 {
		t.Errorf("%d keypairs stored, want 1", n)
	}
}
