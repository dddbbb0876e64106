package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/bench/internal/fanout"
)

// What the section's devices are and send: their names, the commands
// stepcollect is given, the results they answer with, and the sender that
// posts them through NanoMDM's own webhook code.

// e2eEnrollment names the section's enrollment i.
func e2eEnrollment(i int) string { return fmt.Sprintf("E2E-%07d", i) }

func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := strings.ToUpper(hex.EncodeToString(b))
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// commandPlist is the command stepcollect is given with its step: the
// inventory workflow's, as NanoCMD enqueues it.
func commandPlist(c enqueuedCommand) []byte {
	queries := ""
	if c.RequestType == "DeviceInformation" {
		queries = "<key>Queries</key><array><string>Model</string><string>SerialNumber</string><string>Model</string><string>ModelName</string>" +
			"<string>DeviceName</string><string>BuildVersion</string><string>OSVersion</string><string>EthernetMAC</string>" +
			"<string>IsAppleSilicon</string><string>HasBattery</string><string>IsMultiUser</string><string>SupportsLOMDevice</string></array>"
	}
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict><key>Command</key><dict>%s<key>RequestType</key><string>%s</string></dict><key>CommandUUID</key><string>%s</string></dict></plist>
`, queries, c.RequestType, c.UUID)
}

// resultPlist is enrollment id's answer to c, as a Mac would give it: the
// queried values of DeviceInformation, or SecurityInfo's dictionary.
func resultPlist(id string, c enqueuedCommand) []byte {
	var payload string
	switch c.RequestType {
	case "DeviceInformation":
		payload = fmt.Sprintf(`<key>QueryResponses</key><dict><key>BuildVersion</key><string>23E224</string><key>DeviceName</key><string>Mac %[1]s</string>`+
			`<key>IsAppleSilicon</key><true/><key>Model</key><string>Mac14,2</string><key>ModelName</key><string>MacBook Air</string>`+
			`<key>OSVersion</key><string>14.4.1</string><key>SerialNumber</key><string>SN%[1]s</string></dict>`, id)
	case "SecurityInfo":
		payload = `<key>SecurityInfo</key><dict><key>AuthenticatedRootVolumeEnabled</key><true/><key>FDE_Enabled</key><false/>` +
			`<key>FirewallSettings</key><dict><key>BlockAllIncoming</key><false/><key>FirewallEnabled</key><false/><key>StealthMode</key><false/></dict>` +
			`<key>ManagementStatus</key><dict><key>EnrolledViaDEP</key><false/><key>IsUserEnrollment</key><false/><key>UserApprovedEnrollment</key><true/></dict>` +
			`<key>RemoteDesktopEnabled</key><false/><key>SecureBoot</key><dict><key>SecureBootLevel</key><string>full</string></dict>` +
			`<key>SystemIntegrityProtectionEnabled</key><true/></dict>`
	}
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict><key>CommandUUID</key><string>%s</string>%s<key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string></dict></plist>
`, c.UUID, payload, id)
}

// e2eJob is one enrollment's answers, sent one after another, in the order
// the commands were enqueued (a device answers its queue in order).
type e2eJob struct {
	id   string
	cmds []enqueuedCommand
}

type sendResult struct {
	lat    []time.Duration // of each webhook request
	ok     int
	errors map[string]int
	last   time.Time // the last answer
	t0     time.Time
}

// sendResults answers every job's commands through sender, inflight
// enrollments at a time (so at most inflight requests in flight), from t0
// on: the caller takes its snapshots just before.
func sendResults(sender *webhook.Webhook, jobs []e2eJob, inflight int, t0 time.Time) *sendResult {
	total := 0
	raws := make([][][]byte, len(jobs))
	for i, j := range jobs {
		for _, c := range j.cmds {
			raws[i] = append(raws[i], resultPlist(j.id, c))
		}
		total += len(j.cmds)
	}
	s := &sendResult{lat: make([]time.Duration, 0, total), errors: map[string]int{}, t0: t0}
	var mu sync.Mutex
	var wg sync.WaitGroup
	next := make(chan int)
	for range min(inflight, len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				j := jobs[i]
				for k, c := range j.cmds {
					r := mdm.NewRequestWithContext(context.Background(), nil)
					r.EnrollID = &mdm.EnrollID{ID: j.id, Type: mdm.Device}
					t := time.Now()
					_, err := sender.CommandAndReportResults(r, &mdm.CommandResults{
						Enrollment: mdm.Enrollment{UDID: j.id}, CommandUUID: c.UUID, Status: "Acknowledged", Raw: raws[i][k]})
					at := time.Now()
					mu.Lock()
					s.lat = append(s.lat, at.Sub(t))
					if err != nil {
						s.errors[webhookErrClass(err)]++
					} else {
						s.ok++
					}
					if at.After(s.last) {
						s.last = at
					}
					mu.Unlock()
				}
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	return s
}

// webhookErrClass is "http <status>" for an answer other than 200, or
// "http: no answer".
func webhookErrClass(err error) string {
	const prefix = "unexpected HTTP status: "
	if msg := err.Error(); strings.HasPrefix(msg, prefix) {
		code, _, _ := strings.Cut(msg[len(prefix):], " ")
		return "http " + code
	}
	return "http: no answer"
}

func (run *e2eRun) fill(s *sendResult) {
	run.Webhooks, run.OK, run.Errors = len(s.lat), s.ok, s.errors
	run.P50MS, run.P99MS = fanout.Quantiles(s.lat)
	if !s.last.IsZero() {
		run.LastAnswerMS = fanout.MS(s.last.Sub(s.t0))
	}
}
