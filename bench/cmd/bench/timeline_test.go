package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A timeline is a header naming each process and a row every 50 ms with
// the answers so far and each process's CPU since the release, appended
// after a # line per burst.
func TestTimelineAppendsSamplesPerBurst(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.tsv")
	pids := map[string]int{"worker": os.Getpid(), "api": os.Getpid()}
	for burst := range 2 {
		start := time.Now()
		answered := 0
		tl := startTimeline(start, pids, cpuTimes(pids), func() int { answered += 7; return answered }, nil)
		time.Sleep(180 * time.Millisecond)
		if err := tl.write(path, 100+burst); err != nil {
			t.Fatal(err)
		}
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	bursts := strings.Split(string(b), "# a service burst of N=")[1:]
	if len(bursts) != 2 || !strings.HasPrefix(bursts[0], "100 ") || !strings.HasPrefix(bursts[1], "101 ") {
		t.Fatalf("want two bursts, N=100 and N=101:\n%s", b)
	}
	lines := strings.Split(strings.TrimSpace(bursts[0]), "\n")
	if lines[1] != "ms\tanswered\tapi cpu ms\tworker cpu ms" {
		t.Errorf("header %q", lines[1])
	}
	if len(lines) < 4 { // 180 ms: at least 3 samples
		t.Fatalf("%d lines, want a header and 3 samples or more:\n%s", len(lines), bursts[0])
	}
	if f := strings.Split(lines[2], "\t"); len(f) != 4 || f[1] != "7" {
		t.Errorf("first sample %q: want 4 fields, 7 answered", lines[2])
	}
}

// With the server's counters, each sample carries those the server has
// (the first read names them) as their change since the release, and a
// failed read leaves a dash, not a number.
func TestTimelineCarriesServerCounters(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.tsv")
	pids := map[string]int{"api": os.Getpid()}
	reads := 0
	status := func() map[string]int64 {
		reads++
		switch {
		case reads == 1:
			return map[string]int64{"Questions": 1000, "Com_delete": 50}
		case reads == 3:
			return nil // a read that failed
		default:
			return map[string]int64{"Questions": 1000 + int64(10*reads), "Com_delete": 50 + int64(reads)}
		}
	}
	tl := startTimeline(time.Now(), pids, cpuTimes(pids), func() int { return 1 }, status)
	time.Sleep(180 * time.Millisecond)
	if err := tl.write(path, 5); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if lines[1] != "ms\tanswered\tapi cpu ms\tQuestions\tCom_delete" {
		t.Fatalf("header %q", lines[1])
	}
	if f := strings.Split(lines[2], "\t"); len(f) != 5 || f[3] != "20" || f[4] != "2" {
		t.Errorf("first sample %q: want Questions 20 and Com_delete 2 since the release", lines[2])
	}
	if f := strings.Split(lines[3], "\t"); len(f) != 5 || f[3] != "-" || f[4] != "-" {
		t.Errorf("second sample %q: want dashes for the failed read", lines[3])
	}
}
