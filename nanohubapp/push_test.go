package nanohubapp

import (
	"context"
	"errors"
	"testing"

	"github.com/micromdm/nanolib/log"
	"github.com/micromdm/nanomdm/push"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/stepcollect/stepcollect/metrics"
)

type pusherFunc func(context.Context, []string) (map[string]*push.Response, error)

func (f pusherFunc) Push(ctx context.Context, ids []string) (map[string]*push.Response, error) {
	return f(ctx, ids)
}

// A push that fails, whole or for some ids, is counted and never returned:
// NanoMDM's enqueuer would make it the enqueue's error.
func TestAFailedPushIsCountedNotReturned(t *testing.T) {
	m := metrics.NewMDM(prometheus.NewRegistry())
	for _, tc := range []struct {
		name   string
		pusher pusherFunc
		want   float64
	}{
		{"all", func(context.Context, []string) (map[string]*push.Response, error) {
			return nil, errors.New("no push certificate")
		}, 2},
		{"one", func(context.Context, []string) (map[string]*push.Response, error) {
			return map[string]*push.Response{"A": {Id: "1"}, "B": {Err: errors.New("BadDeviceToken")}}, nil
		}, 3},
	} {
		p := bestEffortPusher{Pusher: tc.pusher, metrics: m, logger: log.NopLogger}
		res, err := p.Push(context.Background(), []string{"A", "B"})
		if err != nil {
			t.Errorf("%s: returned %v", tc.name, err)
		}
		for id, r := range res {
			if r.Err != nil {
				t.Errorf("%s: %s's error returned: %v", tc.name, id, r.Err)
			}
		}
		if got := testutil.ToFloat64(m.PushFailures); got != tc.want {
			t.Errorf("%s: stepcollect_mdm_push_failures_total %v, want %v", tc.name, got, tc.want)
		}
	}
}
