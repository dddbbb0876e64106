package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// fanoutIDs are n enrollment ids as long as a Mac's UDID.
func fanoutIDs(n int) ([]string, url.Values) {
	ids := make([]string, n)
	q := url.Values{}
	for i := range ids {
		ids[i] = fmt.Sprintf("0000FE00-%016X", i)
		q.Add("id", ids[i])
	}
	return ids, q
}

// answerAll answers every command enqueued for ids through NanoMDM's
// webhook sender, 16 at a time, and fails on any non-2xx.
func answerAll(t *testing.T, s *server, ids []string) {
	t.Helper()
	sender := webhook.New(s.base+"/webhook", webhook.WithHMACSecret([]byte(hmacKey)))
	work := make(chan string)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []string
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				for _, c := range s.mdm.commands(id) {
					if err := answer(sender, id, c); err != nil {
						mu.Lock()
						errs = append(errs, fmt.Sprintf("%s %s: %v", id, c.RequestType, err))
						mu.Unlock()
					}
				}
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d webhooks not answered 2xx, first: %s", len(errs), errs[0])
	}
}

// One start for 1,000 enrollments reaches all of them, through a NanoMDM
// that refuses a command UUID it has stored (as its storages do): NanoCMD
// v0.7.1's enqueuer, and this one before it split fan-outs, sent one UUID
// in requests of 30 ids, so 30 devices got the command and the rest
// waited for the step's timeout. Every device answers; every inventory
// is filled and no step row is left.
func TestOneStartReachesEveryEnrollment(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	ids, q := fanoutIDs(1000)
	if code, body := s.do(t, "POST", "/v1/workflow/"+inventory+"/start?"+q.Encode(), true); code != http.StatusOK {
		t.Fatalf("workflow start: %d %s", code, body)
	}
	reached := 0
	for _, id := range ids {
		if len(s.mdm.commands(id)) == 2 {
			reached++
		}
	}
	if reached != len(ids) {
		t.Fatalf("%d of %d enrollments were enqueued both inventory commands; refused: %v", reached, len(ids), s.mdm.bad)
	}
	answerAll(t, s, ids)
	if n := testkit.Count(t, db.DB, "SELECT COUNT(*) FROM subsystem_inventory"); n != len(ids) {
		t.Errorf("%d inventory rows, want %d", n, len(ids))
	}
	testkit.WaitUntil(t, 30*time.Second, "no step rows left", func() (bool, any) {
		rows := testkit.CountStepRows(t, db.DB)
		return rows == testkit.StepRows{}, rows
	})
}

// An enqueue NanoMDM refuses: the start answers an error naming the ids and
// NanoMDM's words; no step waits for a device that never got its command
// (on MySQL exactly the refused ids' are cancelled), and the other
// enrollments run to the end. The refusal is counted.
func TestARefusedEnqueueIsReportedAndNothingWaitsForIt(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db, "-enqueue-max-url-bytes", "2000")
	ids, q := fanoutIDs(300)
	refused := ids[250]
	s.mdm.mu.Lock()
	s.mdm.refuse[refused] = true
	s.mdm.mu.Unlock()
	code, body := s.do(t, "POST", "/v1/workflow/"+inventory+"/start?"+q.Encode(), true)
	var answer struct{ Error string }
	if err := json.Unmarshal(body, &answer); err != nil || code/100 == 2 ||
		!strings.Contains(answer.Error, refused) || !strings.Contains(answer.Error, "foreign key constraint fails") || !strings.Contains(answer.Error, "cancelled") {
		t.Fatalf("start with %s refused: %d %s, want an error naming it, NanoMDM's words, and its step cancelled", refused, code, body)
	}
	// the refused request's ids (a group of them, counted in the error)
	// have no step; every other has
	var failed int
	if _, err := fmt.Sscanf(answer.Error[strings.Index(answer.Error, "for "):], "for %d of 300 ids", &failed); err != nil || failed < 1 {
		t.Fatalf("no count of refused ids in %q (%v)", answer.Error, err)
	}
	notRefused := testkit.Column[string](t, db.DB, "SELECT DISTINCT enrollment_id FROM id_commands")
	if len(notRefused) != len(ids)-failed || len(notRefused) < 200 || slices.Contains(notRefused, refused) {
		t.Fatalf("%d enrollments have commands waiting, want the %d not refused, without %s (%s)", len(notRefused), len(ids)-failed, refused, answer.Error)
	}
	answerAll(t, s, notRefused)
	testkit.WaitUntil(t, 30*time.Second, "no step rows left", func() (bool, any) {
		rows := testkit.CountStepRows(t, db.DB)
		return rows == testkit.StepRows{}, rows
	})
	code, metrics := s.do(t, "GET", "/metrics", false)
	// counted a command an enrollment: the inventory's two, both refused
	want := fmt.Sprintf(`stepcollect_mdm_enqueues_total{outcome="refused"} %d`, 2*failed)
	if code != http.StatusOK || !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics: no %q", want)
	}
}

// A result that completes a step is stored whatever its workflow then makes
// of it: the webhook answers 200 (NanoCMD v0.7.1 answers 500, and NanoMDM
// logs a failed webhook for a result that was kept), and the workflow's
// failure is counted and logged with the step's workflow and enrollment.
func TestAStoredResultIsAnswered200WhenItsWorkflowFails(t *testing.T) {
	t.Parallel()
	db := testkit.NewDB(t, &testkit.DBOptions{Empty: true})
	s := startMySQL(t, db)
	const id = "0000FE00-ERRORING"
	if code, body := s.do(t, "POST", "/v1/workflow/"+inventory+"/start?id="+id, true); code != http.StatusOK {
		t.Fatalf("workflow start: %d %s", code, body)
	}
	sender := webhook.New(s.base+"/webhook", webhook.WithHMACSecret([]byte(hmacKey)))
	for _, c := range s.mdm.commands(id) {
		status, raw := "Acknowledged", resultPlist(id, c)
		if c.RequestType == "DeviceInformation" {
			// the inventory workflow refuses an Error answer to its step
			status = "Error"
			raw = fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>CommandUUID</key><string>%s</string><key>ErrorChain</key><array><dict><key>ErrorCode</key><integer>12021</integer><key>ErrorDomain</key><string>MCMDMErrorDomain</string><key>LocalizedDescription</key><string>Not now</string></dict></array><key>Status</key><string>Error</string><key>UDID</key><string>%s</string></dict></plist>`, c.UUID, id)
		}
		r := mdm.NewRequestWithContext(context.Background(), nil)
		r.EnrollID = &mdm.EnrollID{ID: id, Type: mdm.Device}
		if _, err := sender.CommandAndReportResults(r, &mdm.CommandResults{Enrollment: mdm.Enrollment{UDID: id}, CommandUUID: c.UUID, Status: status, Raw: raw}); err != nil {
			t.Fatalf("%s (%s): %v, want 200", c.RequestType, status, err)
		}
	}
	if rows := testkit.CountStepRows(t, db.DB); rows != (testkit.StepRows{}) {
		t.Errorf("step rows left: %+v, want the step completed and collected", rows)
	}
	_, metrics := s.do(t, "GET", "/metrics", false)
	if want := `stepcollect_workflow_errors_total{workflow="` + inventory + `"} 1`; !strings.Contains(string(metrics), want) {
		t.Errorf("/metrics: no %q", want)
	}
	testkit.WaitUntil(t, 10*time.Second, "the workflow's failure logged with its step", func() (bool, any) {
		logs := s.proc.Logs()
		return strings.Contains(logs, "its workflow failed on the completed step") && strings.Contains(logs, id) && strings.Contains(logs, inventory), nil
	})
}
