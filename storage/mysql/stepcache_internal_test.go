package mysql

import (
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
)

func TestStepCacheEvictsTheLeastRecentlyUsedAndHandsOutCopies(t *testing.T) {
	t.Parallel()
	c := newStepCache(2, time.Hour)
	c.put(1, nanostorage.StepContext{WorkflowName: "one", Context: []byte("ctx")})
	c.put(2, nanostorage.StepContext{WorkflowName: "two"})
	if _, ok := c.get(1); !ok { // 1 is now the most recently used
		t.Fatal("1 missing")
	}
	c.put(3, nanostorage.StepContext{WorkflowName: "three"})
	if _, ok := c.get(2); ok {
		t.Error("2 should have been evicted")
	}
	got, ok := c.get(1)
	if !ok || got.WorkflowName != "one" {
		t.Fatalf("1: %+v %v", got, ok)
	}
	got.Context[0] = 'X'
	if again, _ := c.get(1); string(again.Context) != "ctx" {
		t.Errorf("a caller's change reached the cache: %q", again.Context)
	}
	c.put(4, nanostorage.StepContext{Context: make([]byte, maxCachedContext+1)})
	if _, ok := c.get(4); ok {
		t.Error("an oversized context was cached")
	}
}

func TestStepCacheEntriesExpire(t *testing.T) {
	t.Parallel()
	c := newStepCache(10, time.Minute)
	c.put(1, nanostorage.StepContext{WorkflowName: "one"})
	if _, ok := c.get(1); !ok {
		t.Fatal("an entry within its TTL not returned")
	}
	// the entry ages past its TTL
	c.mu.Lock()
	c.entries[1].Value.(*stepEntry).at = time.Now().Add(-2 * time.Minute)
	c.mu.Unlock()
	if _, ok := c.get(1); ok {
		t.Error("expired entry returned")
	}
}
