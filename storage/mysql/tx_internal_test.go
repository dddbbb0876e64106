package mysql

import (
	"database/sql/driver"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/storage"
)

func TestRetryReasonClassifiesWhatIsWorthRetrying(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&mysql.MySQLError{Number: 1213, Message: "Deadlock found"}, "deadlock"},
		{fmt.Errorf("locking: %w", &mysql.MySQLError{Number: 1205}), "lock_wait_timeout"},
		{&mysql.MySQLError{Number: 1927}, "connection"},
		{mysql.ErrInvalidConn, "connection"},
		{fmt.Errorf("commit: %w", driver.ErrBadConn), "connection"},
		{&mysql.MySQLError{Number: 1062}, ""},
		{storage.ErrUnknownCommand, ""},
		{errors.New("something else"), ""},
	} {
		if got := retryReason(tc.err); got != tc.want {
			t.Errorf("retryReason(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestExpandWritesOutEachList(t *testing.T) {
	got := expand("SELECT 1 WHERE a IN (?) AND b = ? AND (c, d) IN ((?, ?)) AND e IN (?)", 3, 2, 1)
	want := "SELECT 1 WHERE a IN (?, ?, ?) AND b = ? AND (c, d) IN ((?, ?), (?, ?)) AND e IN (?)"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestBackoffIsJitteredAndBounded(t *testing.T) {
	s := &Storage{backoffBase: 5 * time.Millisecond, backoffMax: 500 * time.Millisecond}
	seen := map[time.Duration]bool{}
	for n := 1; n <= 30; n++ {
		for range 20 {
			d := s.backoff(n)
			if d <= 0 || d > s.backoffMax {
				t.Fatalf("backoff(%d) = %v, outside (0, %v]", n, d, s.backoffMax)
			}
			seen[d] = true
		}
	}
	if len(seen) < 100 {
		t.Errorf("only %d distinct delays in 600 draws: not jittered", len(seen))
	}
}
