package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

func TestV1RequiresTheAPIKey(t *testing.T) {
	b := setup(t, nil)
	for _, tc := range []struct {
		name string
		set  func(*http.Request)
		want int
	}{
		{"none", func(*http.Request) {}, 401},
		{"wrong bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer nope") }, 401},
		{"bearer", func(r *http.Request) { r.Header.Set("Authorization", "Bearer "+apiKey) }, 404},
		{"BEARER (schemes are case-insensitive)", func(r *http.Request) { r.Header.Set("Authorization", "BEARER "+apiKey) }, 404},
		{"basic, any user", func(r *http.Request) { r.SetBasicAuth("nanocmd", apiKey) }, 404},
		{"basic, wrong password", func(r *http.Request) { r.SetBasicAuth("x", "nope") }, 401},
	} {
		req, _ := http.NewRequest("GET", b.srv.URL+"/v1/steps/999", nil)
		tc.set(req)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, resp.StatusCode, tc.want)
		}
	}

	none := ""
	open := setup(t, &setupOpts{apiKey: &none})
	req, _ := http.NewRequest("GET", open.srv.URL+"/v1/steps/1", nil)
	req.Header.Set("Authorization", "Bearer ")
	resp, _ := http.DefaultClient.Do(req)
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 401 || !strings.Contains(string(raw), "set -api-key") {
		t.Errorf("with no key configured: %d %s, want 401 saying to set one", resp.StatusCode, raw)
	}
}

func TestV1StepsLifecycle(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "io.example.lifecycle", []string{"D1", "D2"}, "L-1")
	status, st := b.client.V1(t, "GET", "/v1/steps/"+itoa(id), nil)
	if status != 200 || st["outstanding_ids"].(float64) != 2 || st["workflow_name"] != "io.example.lifecycle" || st["step_name"] != "query" || st["created_at"] == "" {
		t.Fatalf("status: %d %v", status, st)
	}
	if status, _ := b.client.V1(t, "DELETE", "/v1/enrollments/D1/steps?workflow_name=other.workflow", nil); status != 204 {
		t.Fatalf("cancel of another workflow: %d", status)
	}
	if _, st := b.client.V1(t, "GET", "/v1/steps/"+itoa(id), nil); st["outstanding_ids"].(float64) != 2 {
		t.Errorf("cancelling another workflow touched this one: %v", st)
	}
	if status, _ := b.client.V1(t, "DELETE", "/v1/enrollments/D1/steps?workflow_name=io.example.lifecycle", nil); status != 204 {
		t.Fatalf("cancel: %d", status)
	}
	if _, st := b.client.V1(t, "GET", "/v1/steps/"+itoa(id), nil); st["outstanding_ids"].(float64) != 1 {
		t.Errorf("after cancelling D1: %v", st)
	}
	if err := sendResult(b.sender(nil), "D2", "L-1", "Acknowledged"); err != nil {
		t.Fatal(err)
	}
	status, body := b.client.V1(t, "GET", "/v1/steps/"+itoa(id), nil)
	if status != 404 || !strings.Contains(body["error"].(string), "no such step") {
		t.Errorf("after the last result: %d %v, want 404", status, body)
	}
}

// Any string is an enrollment id, escaped in the path; "/" alone is the
// one ServeMux cannot route by itself (it is its trailing-slash marker).
func TestV1CancelTakesEveryEscapedEnrollmentID(t *testing.T) {
	b := setup(t, nil)
	ids := []string{"/", "a/b", "/x", "y/", "//", "..", "E 1", "KEEP"}
	id := b.enqueue(t, "io.example.escaped", ids, "ESC-1")
	for _, e := range ids[:len(ids)-1] {
		path := "/v1/enrollments/" + url.PathEscape(e) + "/steps?workflow_name=io.example.escaped"
		if e == "/" {
			path = "/v1/enrollments/%2f/steps?workflow_name=io.example.escaped" // as some clients write it
		}
		if e == ".." {
			path = "/v1/enrollments/%2E%2E/steps?workflow_name=io.example.escaped" // url.PathEscape leaves dots
		}
		if status, body := b.client.V1(t, "DELETE", path, nil); status != 204 {
			t.Errorf("DELETE %s: %d %v, want 204", path, status, body)
		}
	}
	status, out := b.client.V1(t, "GET", "/v1/steps/"+itoa(id)+"/outstanding", nil)
	if got := fmt.Sprint(out["ids"]); status != 200 || got != "[KEEP]" {
		t.Errorf("outstanding after cancelling all but KEEP: %d %s, want [KEEP]", status, got)
	}
}

func TestV1EnqueueRejectsBadStepsNamingTheFieldAndWritesNothing(t *testing.T) {
	b := setup(t, nil)
	b.enqueue(t, "wf.existing", []string{"HELD-1", "HELD-2"}, "HELD-UUID")
	before := snapshot(t, b.db.DB)
	step := func(mod func(m map[string]any)) map[string]any {
		m := map[string]any{
			"workflow_name": "wf", "instance_id": "i", "ids": []string{"A", "B"},
			"commands": []map[string]string{{"command_uuid": "U-1", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}},
		}
		mod(m)
		return m
	}
	for _, tc := range []struct {
		name string
		body any
		want int
		msg  string
	}{
		{"not json", "{", 400, "body: not JSON"},
		{"empty", "", 400, "body: empty"},
		{"unknown field", `{"workflowName":"x"}`, 400, `body: unknown field "workflowName"`},
		{"ids not a list", `{"ids":"A"}`, 400, "ids: want an array, got a JSON string"},
		{"no workflow", step(func(m map[string]any) { delete(m, "workflow_name") }), 400, "workflow_name: missing"},
		{"no instance", step(func(m map[string]any) { delete(m, "instance_id") }), 400, "instance_id: missing"},
		{"empty ids", step(func(m map[string]any) { m["ids"] = []string{} }), 400, "ids: empty"},
		{"empty commands", step(func(m map[string]any) { m["commands"] = []any{} }), 400, "commands: empty"},
		{"repeated uuid", step(func(m map[string]any) {
			m["commands"] = []map[string]string{{"command_uuid": "U", "request_type": "X"}, {"command_uuid": "U", "request_type": "Y"}}
		}), 400, `commands[1].command_uuid: "U" repeats commands[0]`},
		{"bad base64", step(func(m map[string]any) { m["context"] = "!!" }), 400, "context: not standard base64"},
		// encoding/json takes a byte that is not UTF-8 for U+FFFD: the
		// step would hold another id than the client's
		{"an id not UTF-8", `{"workflow_name":"wf","instance_id":"i","ids":["A` + "\xff" + `"],"commands":[{"command_uuid":"U-2","request_type":"X"}]}`,
			400, "body: not UTF-8 at byte 49 (0xff); JSON must be UTF-8"},
		{"an id with a control character", step(func(m map[string]any) { m["ids"] = []string{"A\tB"} }), 400, `ids[0]: "A\tB" holds a control character`},
		// names are shown, logged and compared as something else, as ids would be
		{"a workflow name with NUL", step(func(m map[string]any) { m["workflow_name"] = "wf\x00" }), 400, `workflow_name: "wf\x00" holds a control character`},
		{"an instance id with a newline", step(func(m map[string]any) { m["instance_id"] = "i\n2" }), 400, `instance_id: "i\n2" holds a control character`},
		{"a step name with DEL", step(func(m map[string]any) { m["step_name"] = "s\x7f" }), 400, `step_name: "s\x7f" holds a control character`},
		{"a request type with a C1 control", step(func(m map[string]any) {
			m["commands"] = []map[string]string{{"command_uuid": "U-3", "request_type": "Device\u0085Information"}}
		}), 400, `commands[0].request_type: "Device\u0085Information" holds a control character`},
		{"bad time", step(func(m map[string]any) { m["timeout"] = "tomorrow" }), 400, `timeout: "tomorrow" is not an RFC 3339 time`},
		// the zero time was taken for "not set": a step sent now, or the default timeout
		{"year 1 not_until", step(func(m map[string]any) { m["not_until"] = "0001-01-01T00:00:00Z" }), 400, "not_until: 0001-01-01T00:00:00Z is outside what MySQL can store"},
		{"year 1 timeout, another zone", step(func(m map[string]any) { m["timeout"] = "0001-01-01T01:00:00+01:00" }), 400, "timeout: 0001-01-01T01:00:00+01:00 is outside what MySQL can store"},
		{"timeout before not_until", step(func(m map[string]any) {
			m["not_until"], m["timeout"] = "2030-01-02T00:00:00Z", "2030-01-01T00:00:00Z"
		}), 400, "timeout: 2030-01-01T00:00:00Z is not after not_until (2030-01-02T00:00:00Z)"},
		{"a second object after the step", `{"workflow_name":"wf","instance_id":"i","ids":["A"],"commands":[{"command_uuid":"U-2","request_type":"X"}]} {}`,
			400, "body: more after the step's JSON object"},
		{"held uuid", step(func(m map[string]any) {
			m["ids"] = []string{"NEW-1", "HELD-2"}
			m["commands"] = []map[string]string{{"command_uuid": "HELD-UUID", "request_type": "DeviceInformation"}}
		}), 409, `enrollment "HELD-2" already holds command "HELD-UUID"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := b.client.V1(t, "POST", "/v1/steps", tc.body)
			msg, _ := body["error"].(string)
			if status != tc.want || !strings.Contains(msg, tc.msg) || strings.Contains(msg, "\n") {
				t.Errorf("%d %q, want %d containing %q", status, msg, tc.want, tc.msg)
			}
		})
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Errorf("rejected steps changed the database")
	}
}

func TestV1StepWithNotUntilAndTimeoutIsStored(t *testing.T) {
	b := setup(t, nil)
	status, body := b.client.V1(t, "POST", "/v1/steps", map[string]any{
		"workflow_name": "wf", "instance_id": "i", "ids": []string{"A"},
		"commands":  []map[string]string{{"command_uuid": "U-1", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}},
		"not_until": time.Now().Add(time.Hour).UTC().Format(time.RFC3339), "timeout": time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339),
	})
	if status != 201 {
		t.Fatalf("%d %v", status, body)
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM step_commands WHERE command = '<plist/>'`); n != 1 {
		t.Errorf("raw command not kept for the not_until step")
	}
	if n := testkit.Count(t, b.db.DB, `SELECT COUNT(*) FROM steps WHERE not_until IS NOT NULL AND timeout IS NOT NULL`); n != 1 {
		t.Errorf("not_until/timeout not stored")
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// The step (40,000 ids x 2,000 commands) is refused at the default
// limits in well under a second, by a 413 naming the count, the limit and
// the flag, and nothing is written.
func TestV1StepsOverTheDefaultLimitsIs413AndWritesNothing(t *testing.T) {
	b := setup(t, nil)
	before := snapshot(t, b.db.DB)
	start := time.Now()
	status, body := b.client.V1(t, "POST", "/v1/steps", string(testkit.V1StepJSON(40_000, 2_000)))
	msg, _ := body["error"].(string)
	want := "ids x commands: 80000000 rows, more than the 1000000 allowed (-max-step-rows)"
	if status != http.StatusRequestEntityTooLarge || msg != want {
		t.Errorf("%d %q, want 413 %q", status, msg, want)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v to refuse", took)
	}
	if after := snapshot(t, b.db.DB); after != before {
		t.Error("a refused step changed the database")
	}
}

// Each limit refuses one over it and takes one at it; a body of a million
// {} is refused by its count without a million structs being built.
func TestV1StepsLimitsNameTheFieldTheCountTheLimitAndTheFlag(t *testing.T) {
	b := setup(t, nil)
	h := httpapi.New(httpapi.Config{Store: b.store, APIKey: apiKey, Logger: zerolog.New(zerolog.NewTestWriter(t)),
		MaxStepIDs: 10, MaxStepCommands: 3, MaxStepRows: 20})
	srv := httptest.NewServer(h)
	defer srv.Close()
	post := func(body string) (int, string) {
		req, _ := http.NewRequest("POST", srv.URL+"/v1/steps", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKey)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, strings.TrimSpace(string(raw))
	}
	for _, tc := range []struct {
		name string
		body string
		want string
	}{
		{"ids", string(testkit.V1StepJSON(11, 1)), `{"error":"ids: 11 ids, more than the 10 allowed (-max-step-ids)"`},
		{"commands", string(testkit.V1StepJSON(1, 4)), `{"error":"commands: 4 commands, more than the 3 allowed (-max-step-commands)"`},
		{"rows", string(testkit.V1StepJSON(7, 3)), `{"error":"ids x commands: 21 rows, more than the 20 allowed (-max-step-rows)"`},
		{"a million commands", `{"workflow_name":"w","instance_id":"i","ids":["A"],"commands":[{}` + strings.Repeat(`,{}`, 999_999) + `]}`,
			`{"error":"ids x commands: 1000000 rows, more than the 20 allowed (-max-step-rows)"`},
		{"a million ids, commands first", `{"commands":[{"command_uuid":"U"}],"ids":[""` + strings.Repeat(`,""`, 999_999) + `]}`,
			`{"error":"ids x commands: 1000000 rows, more than the 20 allowed (-max-step-rows)"`},
		{"ids, nested", `{"ids":[[1,2],{"a":[3,","]},"x\",y"],"commands":[]}`, `{"error":"ids: want string, got a JSON array"`},
	} {
		status, raw := post(tc.body)
		wantStatus := http.StatusRequestEntityTooLarge
		if tc.name == "ids, nested" {
			wantStatus = http.StatusBadRequest
		}
		if status != wantStatus || !strings.HasPrefix(raw, tc.want) || strings.Contains(raw, "\n") {
			t.Errorf("%s: %d %s, want %d %s…", tc.name, status, raw, wantStatus, tc.want)
		}
	}
	if status, raw := post(string(testkit.V1StepJSON(10, 2))); status != http.StatusCreated {
		t.Errorf("10 ids x 2 commands, at every limit: %d %s, want 201", status, raw)
	}
}

// A step posted without a timeout gets -default-step-timeout's, from now
// or from its not_until; one with a timeout keeps it; 0 gives none.
func TestDefaultStepTimeoutAppliesWhenTheBodyHasNone(t *testing.T) {
	b := setup(t, nil)
	c := serve(t, b, func(cfg *httpapi.Config) { cfg.DefaultStepTimeout = 72 * time.Hour })
	notUntil := time.Now().Add(24 * time.Hour).UTC().Truncate(time.Second)
	post := func(c *testkit.Client, uuid string, extra map[string]any) int64 {
		body := map[string]any{"workflow_name": "wf.t", "instance_id": "i", "ids": []string{"E1"},
			"commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}}}
		for k, v := range extra {
			body[k] = v
		}
		return c.MustEnqueue(t, body)
	}
	timeout := func(id int64) (time.Time, bool) {
		var tm *time.Time
		if err := b.db.QueryRow(`SELECT timeout FROM steps WHERE id = ?`, id).Scan(&tm); err != nil {
			t.Fatal(err)
		}
		if tm == nil {
			return time.Time{}, false
		}
		return *tm, true
	}
	before := time.Now()
	got, ok := timeout(post(c, "U-1", nil))
	if !ok || got.Before(before.Add(72*time.Hour-2*time.Second)) || got.After(time.Now().Add(72*time.Hour+time.Second)) {
		t.Errorf("no timeout given: %v %v, want now+72h", got, ok)
	}
	if got, ok := timeout(post(c, "U-2", map[string]any{"not_until": notUntil.Format(time.RFC3339)})); !ok || !got.Equal(notUntil.Add(72*time.Hour)) {
		t.Errorf("not_until %v: timeout %v, want not_until+72h", notUntil, got)
	}
	// a not_until near the end of what MySQL stores: the default timeout
	// stops there, not a refusal naming a timeout the caller never sent
	last := time.Date(2038, 1, 19, 3, 14, 7, 0, time.UTC)
	if got, ok := timeout(post(c, "U-5", map[string]any{"not_until": "2038-01-18T00:00:00Z"})); !ok || !got.Equal(last) {
		t.Errorf("not_until 2038-01-18: timeout %v %v, want %v", got, ok, last)
	}
	own := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	if got, _ := timeout(post(c, "U-3", map[string]any{"timeout": own.Format(time.RFC3339)})); !got.Equal(own) {
		t.Errorf("own timeout %v became %v", own, got)
	}
	if _, ok := timeout(post(b.client, "U-4", nil)); ok {
		t.Errorf("default 0: a timeout was set")
	}
}

// A conflict names the enrollment and the UUID in full, however long they
// are (ids up to 255 bytes, UUIDs up to 127): error lines were cut at 200
// bytes, before the names the message is there to give.
func TestV1ConflictNamesLongIdsInFull(t *testing.T) {
	b := setup(t, nil)
	id, uuid := "ENROLLMENT-"+strings.Repeat("x", 244), "UUID-"+strings.Repeat("y", 122)
	b.enqueue(t, "wf.long", []string{id}, uuid)
	status, body := b.client.V1(t, "POST", "/v1/steps", map[string]any{
		"workflow_name": "wf.long2", "instance_id": "i", "ids": []string{id},
		"commands": []map[string]string{{"command_uuid": uuid, "request_type": "DeviceInformation"}},
	})
	want := fmt.Sprintf("enrollment %q already holds command %q", id, uuid)
	if msg, _ := body["error"].(string); status != http.StatusConflict || msg != want {
		t.Errorf("%d %q, want 409 %q", status, msg, want)
	}
}

// A step id in a path is its digits alone: "+1" and "01" are not step 1.
func TestStepIDsInPathsAreDigitsAlone(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "wf.path", []string{"P-1"}, "P-UUID")
	for _, p := range []string{"+%d", "0%d", " %d"} {
		path := "/v1/steps/" + url.PathEscape(fmt.Sprintf(p, id))
		for _, suffix := range []string{"", "/outstanding"} {
			status, body := b.client.V1(t, "GET", path+suffix, nil)
			if status != 400 || !strings.Contains(fmt.Sprint(body["error"]), "is not a step id") {
				t.Errorf("GET %s%s: %d %v, want 400 naming the step id", path, suffix, status, body)
			}
		}
	}
	if status, _ := b.client.V1(t, "GET", fmt.Sprintf("/v1/steps/%d", id), nil); status != 200 {
		t.Errorf("GET /v1/steps/%d: %d, want 200", id, status)
	}
}

// encoding/json takes a \u escape of half a UTF-16 surrogate pair for
// U+FFFD: the step would hold another id than the one sent. It is a 400
// naming the field; a whole pair, or an escaped backslash before u, is
// taken.
func TestV1EnqueueRefusesALoneSurrogateNamingTheField(t *testing.T) {
	b := setup(t, nil)
	step := func(wf, id, uuid string) string {
		return `{"workflow_name":"` + wf + `","instance_id":"i","ids":["` + id + `"],"commands":[{"command_uuid":"` + uuid + `","request_type":"X"}]}`
	}
	for _, tc := range []struct {
		name, body string
		want       int
		msg        string
	}{
		{"in an id", step("wf", `a\ud800b`, "U-1"), 400, `ids[0]: \ud800 at byte 49 is half a UTF-16 surrogate pair`},
		{"a low half alone", step(`w\uDC00`, "A", "U-1"), 400, `workflow_name: \uDC00 at byte 19 is half a UTF-16 surrogate pair`},
		{"a high half before another escape", step("wf", "A", `U\ud800\u0041`), 400, `commands[0].command_uuid: \ud800 at byte`},
		{"a high half at the end", step("wf", "A", `U\udbff`), 400, `commands[0].command_uuid: \udbff at byte`},
		{"in a second command", `{"workflow_name":"wf","instance_id":"i","ids":["A"],"commands":[{"command_uuid":"U-1","request_type":"X"},{"command_uuid":"U-2","request_type":"X\ud800"}]}`,
			400, `commands[1].request_type: \ud800 at byte`},
		{"two high halves", step("wf", `\ud800\ud800\udc00`, "U-1"), 400, `ids[0]: \ud800 at byte`},
		{"a whole pair", step("wf", `\ud83d\ude00`, "U-2"), 201, ""},
		{"an escaped backslash", step("wf", `\\ud800`, "U-3"), 201, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body := b.client.V1(t, "POST", "/v1/steps", tc.body)
			msg, _ := body["error"].(string)
			if status != tc.want || !strings.Contains(msg, tc.msg) {
				t.Errorf("%d %q, want %d containing %q", status, msg, tc.want, tc.msg)
			}
		})
	}
}

// Every /v1 answer, a refusal included, is not kept by a cache (it holds
// what the key may read) nor sniffed as another type than its JSON.
func TestV1AnswersAreNotCachedNorSniffed(t *testing.T) {
	b := setup(t, nil)
	id := b.enqueue(t, "wf", []string{"A"}, "U-1")
	for _, tc := range []struct {
		method, path, key, body string
		want                    int
	}{
		{"GET", "/v1/steps", apiKey, "", 200},
		{"GET", fmt.Sprintf("/v1/steps/%d", id), apiKey, "", 200},
		{"POST", "/v1/steps", apiKey, "{", 400},
		{"GET", "/v1/steps", "wrong", "", 401},
		{"GET", "/v1/nothing", apiKey, "", 404},
		{"PUT", "/v1/steps", apiKey, "", 405},
		{"GET", "/v1/events", apiKey, "", 200},
	} {
		req, err := http.NewRequest(tc.method, b.srv.URL+tc.path, strings.NewReader(tc.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tc.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if cc, xcto := resp.Header.Get("Cache-Control"), resp.Header.Get("X-Content-Type-Options"); resp.StatusCode != tc.want || cc != "no-store" || xcto != "nosniff" {
			t.Errorf("%s %s: %d, Cache-Control %q, X-Content-Type-Options %q; want %d, no-store, nosniff", tc.method, tc.path, resp.StatusCode, cc, xcto, tc.want)
		}
	}
}
