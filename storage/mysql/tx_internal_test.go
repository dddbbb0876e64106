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
	t.Parallel()
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

// A read-only server's refusals, as MariaDB and MySQL word them (1290 for
// read_only and MySQL's super_read_only, 1792 in a read-only transaction,
// 1836 InnoDB read-only): not worth an immediate retry (the server stays
// read-only for seconds; with rejectReadOnly=true the driver turns them
// into broken connections, which are retried), and not the input's fault,
// so the api answers 503, never a 4xx, and the sender tries again later.
func TestReadOnlyRefusalsAreNeitherRetriedNorTheInputsFault(t *testing.T) {
	t.Parallel()
	for _, me := range []*mysql.MySQLError{
		{Number: 1290, Message: "The MySQL server is running with the --super-read-only option so it cannot execute this statement"},
		{Number: 1290, Message: "The MariaDB server is running with the --read-only option so it cannot execute this statement"},
		{Number: 1792, Message: "Cannot execute statement in a READ ONLY transaction."},
		{Number: 1836, Message: "Running in read-only mode"},
	} {
		err := fmt.Errorf("storing result: %w", me)
		if got := retryReason(err); got != "" {
			t.Errorf("retryReason(%v) = %q, want no retry", me, got)
		}
		if code := storage.ErrorCode(dataError(err)); code != "" {
			t.Errorf("dataError(%v) has code %q: a read-only server is not the input's fault", me, code)
		}
	}
}

func TestExpandWritesOutEachList(t *testing.T) {
	t.Parallel()
	got := expand("SELECT 1 WHERE a IN (?) AND b = ? AND (c, d) IN ((?, ?)) AND e IN (?)", 3, 2, 1)
	want := "SELECT 1 WHERE a IN (?, ?, ?) AND b = ? AND (c, d) IN ((?, ?), (?, ?)) AND e IN (?)"
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestBackoffIsJitteredAndBounded(t *testing.T) {
	t.Parallel()
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
