package tasks_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/tasks"
)

// With Redis down for whole slots, each slot's enqueue is retried every
// retryEvery but logged at warn twice at most (its first failure, and that
// the slot went by), not once a try: a sweeper and a scheduler logged a
// line a second each through an outage.
func TestRunSlotsLogsAnOutageTwiceASlotNotEachTry(t *testing.T) {
	var buf testkit.LogBuffer
	logger := zerolog.New(&buf).Level(zerolog.DebugLevel)
	var tries atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 2200*time.Millisecond)
	defer cancel()
	tasks.RunSlots(ctx, time.Second, 50*time.Millisecond, logger, func(context.Context, time.Time, time.Duration) error {
		tries.Add(1)
		return errors.New("redis: connection refused")
	})
	// Count warn lines per slot, as the lines name it: a 2.2 s window can
	// touch three or four slots depending on where in a second it starts.
	warnsBySlot := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var l struct {
			Level string `json:"level"`
			Slot  string `json:"slot"`
		}
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if l.Level == "warn" {
			warnsBySlot[l.Slot]++
		}
	}
	if tries.Load() < 20 || len(warnsBySlot) < 2 {
		t.Errorf("%d tries logged warn lines in %d slots, want 20+ tries over 2+ slots:\n%s", tries.Load(), len(warnsBySlot), buf.String())
	}
	for slot, n := range warnsBySlot {
		if n > 2 {
			t.Errorf("slot %s logged %d warn lines, want at most 2 (its first failure, and that it went by):\n%s", slot, n, buf.String())
		}
	}
	if !strings.Contains(buf.String(), "enqueueing failed for the whole slot") {
		t.Errorf("no line says a slot went by without its task:\n%s", buf.String())
	}
}

// A retry that gets the slot's task in says so once, at info.
func TestRunSlotsSaysWhenARetryGotTheSlotIn(t *testing.T) {
	var buf testkit.LogBuffer
	logger := zerolog.New(&buf).Level(zerolog.InfoLevel)
	var tries atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	tasks.RunSlots(ctx, time.Hour, 20*time.Millisecond, logger, func(context.Context, time.Time, time.Duration) error {
		if tries.Add(1) < 5 {
			return errors.New("redis: connection refused")
		}
		return nil
	})
	out := buf.String()
	if strings.Count(out, `"level":"warn"`) != 1 || !strings.Contains(out, `"tries":5`) || !strings.Contains(out, "enqueued after retrying within the slot") {
		t.Errorf("four failed tries then one that worked logged:\n%s\nwant one warn line and one info line naming 5 tries", out)
	}
}
