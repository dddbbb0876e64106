package mysqlstore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/micromdm/nanocmd/subsystem/inventory/storage"
)

// When a group's upsert fails, each enrollment is written again alone, so
// that only the one the server refuses gets an error; values for one
// enrollment from two callers of one group are merged in one row, the
// later key winning; rows go in enrollment order.
func TestAFailedGroupIsWrittenAgainOneEnrollmentAtATime(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var writes [][]string
	patches := map[string]string{}
	block, blocked := make(chan struct{}), make(chan struct{})
	m := newMergeGroups(func(_ context.Context, ids []string, ps [][]byte) error {
		mu.Lock()
		writes = append(writes, slices.Clone(ids))
		first := len(writes) == 1
		mu.Unlock()
		if first { // hold the first write so that the others form one group
			close(blocked)
			<-block
			return nil
		}
		if slices.Contains(ids, "bad") {
			return errors.New("refused")
		}
		mu.Lock()
		for i, id := range ids {
			patches[id] = string(ps[i])
		}
		mu.Unlock()
		return nil
	})
	ctx := t.Context()
	go m.merge(ctx, "first", storage.Values{"k": "v"})
	<-blocked
	errs := map[string]error{}
	var wg sync.WaitGroup
	var emu sync.Mutex
	for _, c := range []struct {
		id string
		v  storage.Values
	}{{"b", storage.Values{"x": "1"}}, {"bad", storage.Values{"x": "2"}}, {"a", storage.Values{"x": "3", "y": true}}} {
		wg.Go(func() {
			err := m.merge(ctx, c.id, c.v)
			emu.Lock()
			errs[c.id] = err
			emu.Unlock()
		})
	}
	for {
		n := 0
		m.runner.Forming(func(g *mergeSet) { n = len(g.values) })
		if n == 3 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// a second value for "a" in the same group
	wg.Go(func() {
		err := m.merge(ctx, "a", storage.Values{"x": "4"})
		emu.Lock()
		errs["a again"] = err
		emu.Unlock()
	})
	for {
		x := ""
		m.runner.Forming(func(g *mergeSet) { x, _ = g.values["a"]["x"].(string) })
		if x == "4" {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(block)
	wg.Wait()
	if errs["a"] != nil || errs["b"] != nil || errs["a again"] != nil || errs["bad"] == nil || !strings.Contains(errs["bad"].Error(), "refused") {
		t.Fatalf("outcomes %v: want only bad refused", errs)
	}
	if !slices.Equal(writes[1], []string{"a", "b", "bad"}) {
		t.Errorf("group write %v, want [a b bad] in one statement", writes[1])
	}
	if len(writes) != 5 {
		t.Errorf("writes %v: want the first, the group, then a, b and bad alone", writes)
	}
	if p := patches["a"]; !strings.Contains(p, `"x":"4"`) || !strings.Contains(p, `"y":true`) {
		t.Errorf("a's patch %s: want both callers' keys, the later x", p)
	}
}
