package tasks_test

import (
	"context"
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
	warns := strings.Count(buf.String(), `"level":"warn"`)
	slots := 3 // a part of one, then two whole ones (at most)
	if tries.Load() < 20 || warns > 2*slots || warns < 2 {
		t.Errorf("%d tries logged %d warn lines, want at most 2 a slot (%d slots):\n%s", tries.Load(), warns, slots, buf.String())
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
