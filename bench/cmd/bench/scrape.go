package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Series of the worker's /metrics the bench reads.
const (
	seriesCollected  = "stepcollect_steps_collected_total"
	seriesLagBucket  = "stepcollect_collection_lag_seconds_bucket{"
	seriesQueueDepth = `asynq_queue_size{queue="stepcollect"}`
	seriesDeliveries = "stepcollect_deliveries_total{"
)

// scrape is one reading of Prometheus text-format pages: every series by
// its name and labels as printed, summed over the pages read (one per
// worker process).
type scrape map[string]float64

var scrapeClient = &http.Client{Timeout: 10 * time.Second}

// scrapeAll reads /metrics at each base URL and sums the series.
func scrapeAll(bases ...string) (scrape, error) {
	s := scrape{}
	for _, base := range bases {
		resp, err := scrapeClient.Get(base + "/metrics")
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("%s/metrics: %s", base, resp.Status)
		}
		for _, line := range strings.Split(string(body), "\n") {
			if line == "" || line[0] == '#' {
				continue
			}
			j := strings.LastIndexByte(line, ' ')
			if j < 0 {
				continue
			}
			v, err := strconv.ParseFloat(line[j+1:], 64)
			if err != nil {
				continue
			}
			s[line[:j]] += v
		}
	}
	return s, nil
}

// sumPrefix sums the series whose name and labels start with prefix and
// contain every one of labels.
func (s scrape) sumPrefix(prefix string, labels ...string) float64 {
	t := 0.0
next:
	for k, v := range s {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		for _, l := range labels {
			if !strings.Contains(k, l) {
				continue next
			}
		}
		t += v
	}
	return t
}

// delivered is how many callbacks the workers saw acknowledged.
func (s scrape) delivered() float64 {
	return s.sumPrefix(seriesDeliveries, `outcome="ok"`)
}

// bucket is one cumulative histogram bucket.
type bucket struct{ le, count float64 }

// lagBuckets is stepcollect_collection_lag_seconds's cumulative buckets,
// minus those of since (nil: from zero), in order of le.
func (s scrape) lagBuckets(since scrape) []bucket {
	var bs []bucket
	for k, c := range s {
		if !strings.HasPrefix(k, seriesLagBucket) {
			continue
		}
		i := strings.Index(k, `le="`)
		if i < 0 {
			continue
		}
		leStr := k[i+4:]
		leStr = leStr[:strings.IndexByte(leStr, '"')]
		le, err := strconv.ParseFloat(leStr, 64)
		if leStr == "+Inf" {
			le, err = math.Inf(1), nil
		}
		if err != nil {
			continue
		}
		if since != nil {
			c -= since[k]
		}
		bs = append(bs, bucket{le, c})
	}
	sort.Slice(bs, func(a, b int) bool { return bs[a].le < bs[b].le })
	return bs
}

// quantileMS interpolates the phi-quantile of cumulative buckets, in ms, as
// Prometheus's histogram_quantile does: linearly within the bucket the
// rank falls in. Zero when the buckets hold nothing.
func quantileMS(bs []bucket, phi float64) float64 {
	if len(bs) == 0 || bs[len(bs)-1].count <= 0 {
		return 0
	}
	rank := phi * bs[len(bs)-1].count
	prevLe, prevC := 0.0, 0.0
	for _, b := range bs {
		if b.count >= rank {
			if math.IsInf(b.le, 1) {
				return prevLe * 1000
			}
			return (prevLe + (b.le-prevLe)*(rank-prevC)/(b.count-prevC)) * 1000
		}
		prevLe, prevC = b.le, b.count
	}
	return prevLe * 1000
}

// countOf is how many observations cumulative buckets hold.
func countOf(bs []bucket) float64 {
	if len(bs) == 0 {
		return 0
	}
	return bs[len(bs)-1].count
}

// shareWithin is the share of the observations at or under le seconds (a
// bucket boundary), exactly: what "p99 under 1 s" is decided on.
func shareWithin(bs []bucket, le float64) float64 {
	total := countOf(bs)
	if total == 0 {
		return 1
	}
	for _, b := range bs {
		if b.le == le {
			return b.count / total
		}
	}
	return math.NaN()
}
