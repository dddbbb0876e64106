package mysql_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// OpenDB's sessions run at READ COMMITTED without a per-transaction SET.
func TestOpenDBSessionsAreReadCommitted(t *testing.T) {
	t.Parallel()
	tdb := testkit.NewDB(t, nil)
	db, err := mysql.OpenDB(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var level string
	if err := db.QueryRow(`SELECT @@SESSION.tx_isolation`).Scan(&level); err != nil {
		// MySQL 8 knows it only as transaction_isolation
		if err := db.QueryRow(`SELECT @@SESSION.transaction_isolation`).Scan(&level); err != nil {
			t.Fatal(err)
		}
	}
	if level != "READ-COMMITTED" {
		t.Errorf("session isolation %s, want READ-COMMITTED", level)
	}
}

// OpenDB's pool keeps its connections between bursts: database/sql's own
// default keeps 2 idle, so every burst of concurrent results opened (and
// then closed) a connection for each result but two.
func TestOpenDBKeepsItsConnectionsBetweenBursts(t *testing.T) {
	t.Parallel()
	tdb := testkit.NewDB(t, nil)
	db, err := mysql.OpenDB(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	burst := func() {
		var wg sync.WaitGroup
		for range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := db.Exec(`DO SLEEP(0.05)`); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	burst()
	burst()
	if st := db.Stats(); st.MaxIdleClosed != 0 || st.MaxOpenConnections != mysql.DefaultPoolSize {
		t.Errorf("after two bursts of 40: %d connections closed for want of idle room, %d open at most; want 0 and %d", st.MaxIdleClosed, st.MaxOpenConnections, mysql.DefaultPoolSize)
	}
}

// OpenDB's pools send every time parameter with at most six fractional
// digits, whatever the caller's time holds: what the server takes as a
// time (see TestSchedulerClaimsLockOnlyTheStepsThatAreDue).
func TestOpenDBSendsTimesInMicroseconds(t *testing.T) {
	t.Parallel()
	tdb := testkit.NewDB(t, nil)
	db, err := mysql.OpenDB(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	at := time.Date(2026, 11, 30, 1, 47, 10, 105304044, time.UTC)
	var sent string
	if err := db.QueryRow(`SELECT CAST(? AS CHAR)`, at).Scan(&sent); err != nil {
		t.Fatal(err)
	}
	if want := "2026-11-30 01:47:10.105304"; sent != want {
		t.Fatalf("the server got %q, want %q", sent, want)
	}
}
