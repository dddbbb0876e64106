package mysql_test

import (
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage/mysql"
)

// A database's queue namespace is one value for every process that reads
// it and another for another database; a row gone missing is written
// again; a database not migrated says so, naming what to do.
func TestQueueNamespaceIsOnePerDatabase(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, b := testkit.NewDB(t, nil), testkit.NewDB(t, nil)
	nsA, err := mysql.QueueNamespace(ctx, a.DB)
	if err != nil {
		t.Fatal(err)
	}
	if len(nsA) != 16 || strings.Trim(nsA, "0123456789abcdef") != "" {
		t.Errorf("namespace %q, want 16 lowercase hex digits (a Redis key part)", nsA)
	}
	other, err := mysql.OpenDB(a.DSN) // another process's pool
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if again, err := mysql.QueueNamespace(ctx, other); err != nil || again != nsA {
		t.Errorf("read again by another pool: %q, %v; want %q", again, err, nsA)
	}
	if nsB, err := mysql.QueueNamespace(ctx, b.DB); err != nil || nsB == nsA {
		t.Errorf("another database's namespace: %q, %v; want one other than %q", nsB, err, nsA)
	}
	a.Exec(`DELETE FROM stepcollect_deployment`)
	if ns, err := mysql.QueueNamespace(ctx, a.DB); err != nil || len(ns) != 16 {
		t.Errorf("after the row was deleted: %q, %v; want a new namespace", ns, err)
	}
	if again, err := mysql.QueueNamespace(ctx, other); err != nil {
		t.Errorf("read again: %v", err)
	} else if ns, _ := mysql.QueueNamespace(ctx, a.DB); ns != again {
		t.Errorf("the rewritten namespace differs between pools: %q and %q", ns, again)
	}

	empty := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	if _, err := mysql.QueueNamespace(ctx, empty.DB); err == nil || !strings.Contains(err.Error(), "not migrated") || !strings.Contains(err.Error(), "-migrate=true") {
		t.Errorf("on a database not migrated: %v, want the schema's error naming -migrate=true", err)
	}
}
