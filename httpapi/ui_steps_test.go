package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// uiPage is the operator page open in headless Chromium, its calls to /v1
// carrying the key, every confirm() accepted (and recorded).
type uiPage struct {
	t   *testing.T
	ctx context.Context

	mu       sync.Mutex
	confirms []string
}

func openUI(t *testing.T, url string) *uiPage {
	t.Helper()
	testkit.RequireBinary(t, "chromium")
	p := &uiPage{t: t, ctx: chromium(t)}
	if err := chromedp.Listen(p.ctx, func(e any) {
		if d, ok := e.(*page.EventJavascriptDialogOpening); ok {
			p.mu.Lock()
			p.confirms = append(p.confirms, d.Message)
			p.mu.Unlock()
			go chromedp.Call(p.ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(p.ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(p.ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": "Bearer " + apiKey}}); err != nil {
		t.Fatal(err)
	}
	p.do("open the page", chromedp.Navigate(url+"/ui/"), chromedp.WaitVisible(chromedp.CSS(`#delivery-state.state-running`)))
	return p
}

// do runs actions, failing the test with what the page shows when they
// do not finish in 30 s.
func (p *uiPage) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	actx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(actx, actions...); err != nil {
		pctx, cancel := context.WithTimeout(p.ctx, 5*time.Second)
		defer cancel()
		shown, serr := chromedp.Run(pctx, chromedp.Evaluate[string](`document.body.innerText`))
		if serr != nil {
			shown = "(unread: " + serr.Error() + ")"
		}
		p.t.Fatalf("%s: %v; the page shows:\n%s", what, err, shown)
	}
}

func (p *uiPage) text(sel string) string {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		p.t.Fatalf("read %s: %v", sel, err)
	}
	return s
}

// rows is the data-step-id of each row of the table with id table, in order.
func (p *uiPage) rows(table string) []string {
	p.t.Helper()
	ids, err := chromedp.Run(p.ctx, chromedp.Evaluate[[]string](fmt.Sprintf(
		`[...document.querySelectorAll('#%s tbody tr')].map((tr) => tr.dataset.stepId)`, table)))
	if err != nil {
		p.t.Fatalf("rows of #%s: %v", table, err)
	}
	return ids
}

// visible reports whether the element with id is shown (it and every
// ancestor without hidden).
func (p *uiPage) visible(id string) bool {
	p.t.Helper()
	v, err := chromedp.Run(p.ctx, chromedp.Evaluate[bool](fmt.Sprintf(
		`document.getElementById(%q).checkVisibility()`, id)))
	if err != nil {
		p.t.Fatalf("visibility of #%s: %v", id, err)
	}
	return v
}

// anyAge shows steps of any age (the page asks for older than an hour).
func anyAge() []chromedp.Action[chromedp.Void] {
	return []chromedp.Action[chromedp.Void]{
		chromedp.SetValue(chromedp.ID("age"), ""),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('age').dispatchEvent(new Event('change'))`),
	}
}

// A step whose not_until is ahead has not been sent to any device: it is
// not stuck, and the stuck table does not list it. It is shown apart, as
// scheduled for its time, and can still be opened.
func TestUIScheduledStepIsNotListedAsStuck(t *testing.T) {
	srv, _ := uiServer(t)
	p := openUI(t, srv.URL)
	p.do("list the steps", chromedp.WaitVisible(chromedp.CSS(`#steps tbody tr[data-step-id="103"]`)))

	if got, want := p.rows("steps"), []string{"101", "102", "103"}; !slices.Equal(got, want) {
		t.Errorf("stuck steps %q, want %q: step 104's not_until is 3 h ahead, it waits on purpose", got, want)
	}
	if got := p.rows("scheduled"); !slices.Equal(got, []string{"104"}) {
		t.Errorf("scheduled steps %q, want [104]", got)
	}
	if !p.visible("scheduled") {
		t.Error("the scheduled steps are not shown")
	}
	// step 103's not_until has passed: it was sent, and is stuck
	if got := p.text(`#scheduled tbody tr[data-step-id="104"] td:nth-child(6)`); !strings.HasPrefix(got, "in 3 h") {
		t.Errorf("step 104 scheduled for %q, want in 3 h", got)
	}
	if got := p.text(`#scheduled thead th:nth-child(6)`); !strings.EqualFold(got, "scheduled for") {
		t.Errorf("the scheduled table's time column is %q", got)
	}
	if p.visible("steps-empty") {
		t.Error(`"no stuck steps" shown beside three stuck steps`)
	}

	p.do("open the scheduled step",
		chromedp.Click(chromedp.CSS(`#scheduled tbody tr[data-step-id="104"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li`)),
	)
	if got := p.text("#detail-id"); got != "104" {
		t.Errorf("detail of step %q, want 104", got)
	}
}

// When every step of the page is scheduled, the page says there is no
// stuck step, and still shows the scheduled one.
func TestUIOnlyScheduledStepsMeansNoStuckStep(t *testing.T) {
	srv, ops := uiServer(t)
	ops.mu.Lock()
	ops.steps = slices.DeleteFunc(ops.steps, func(s map[string]any) bool { return s["step_id"] != 104 })
	ops.mu.Unlock()
	p := openUI(t, srv.URL)
	p.do("list the steps", chromedp.WaitVisible(chromedp.CSS(`#scheduled tbody tr[data-step-id="104"]`)))
	if got := p.rows("steps"); len(got) != 0 {
		t.Errorf("stuck steps %q, want none", got)
	}
	if !p.visible("steps-empty") {
		t.Error(`no "no stuck steps" line when the only step is scheduled`)
	}
}

// The api hands a cancelled step to the worker to collect, so GET
// /v1/steps lists it for a while after the DELETE's 204: the row goes at
// once all the same, and stays gone. A cancel that failed keeps its row
// and says why.
func TestUICancelledStepLeavesTheListAtOnce(t *testing.T) {
	srv, ops := uiServer(t)
	ops.cancelFails["102"] = "cancelling the step: MySQL could not be reached"
	p := openUI(t, srv.URL)
	p.do("list the steps", chromedp.WaitVisible(chromedp.CSS(`#steps tbody tr[data-step-id="103"]`)))

	p.do("cancel step 102, which fails",
		chromedp.Click(chromedp.CSS(`#steps tbody tr[data-step-id="102"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li`)),
		chromedp.Click(chromedp.ID("cancel-step")),
		chromedp.WaitVisible(chromedp.ID("detail-error")),
	)
	if got := p.text("#detail-error"); got != "cancelling the step: MySQL could not be reached" {
		t.Errorf("error line %q, want the API's error", got)
	}
	if got := p.rows("steps"); !slices.Contains(got, "102") {
		t.Errorf("stuck steps %q after a failed cancel of 102: its row must stay", got)
	}
	if !p.visible("step-detail") {
		t.Error("the step's detail closed after a failed cancel")
	}
	if p.visible("notice") {
		t.Errorf("notice %q after a failed cancel", p.text("#notice"))
	}

	p.do("cancel step 101",
		chromedp.Click(chromedp.CSS(`#steps tbody tr[data-step-id="101"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li`)),
		chromedp.Click(chromedp.ID("cancel-step")),
		chromedp.WaitNotPresent(chromedp.CSS(`#steps tbody tr[data-step-id="101"]`)),
		chromedp.WaitVisible(chromedp.ID("notice")),
	)
	if !ops.called("DELETE /v1/steps/101") {
		t.Fatalf("no DELETE /v1/steps/101: %v", ops.calls)
	}
	if !ops.listed(101) {
		t.Fatal("the fake no longer lists step 101: the test does not show what it means to")
	}
	if got := p.text("#notice"); got != "Step 101 cancelled." {
		t.Errorf("notice %q", got)
	}
	if p.visible("step-detail") || p.visible("detail-error") {
		t.Error("the cancelled step's detail (or the earlier error) is still shown")
	}

	// asked again, the listing still has it until it is collected
	p.do("list steps older than a day",
		chromedp.SetValue(chromedp.ID("age"), "24h"),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('age').dispatchEvent(new Event('change'))`),
		chromedp.WaitNotPresent(chromedp.CSS(`#steps tbody tr[data-step-id="103"]`)),
	)
	if !slices.Contains(ops.callsSince("DELETE /v1/steps/101"), "GET /v1/steps?older_than=24h&limit=100") {
		t.Fatalf("no listing of steps older than a day after the cancel: %v", ops.calls)
	}
	if got, want := p.rows("steps"), []string{"102"}; !slices.Equal(got, want) {
		t.Errorf("stuck steps older than a day %q, want %q: 101 was cancelled", got, want)
	}
}

// On the real endpoints and storage, collection handed to a queue no
// worker reads (as the api runs it): a scheduled step is not listed as
// stuck, and a cancelled one goes at once though GET /v1/steps still has
// it.
func TestUIOnTheRealEndpointsScheduledAndCancelledSteps(t *testing.T) {
	testkit.RequireBinary(t, "chromium")
	b := setup(t, &setupOpts{sink: testkit.DropReleases{}})

	stuckStep, _ := testkit.V1FanOut("UISTUCK", 2)
	stuck := b.client.MustEnqueue(t, stuckStep)
	laterStep, _ := testkit.V1FanOut("UILATER", 2)
	laterStep["not_until"] = time.Now().Add(3 * time.Hour).UTC().Format(time.RFC3339)
	laterStep["commands"] = []map[string]string{{"command_uuid": "UILATER-CMD", "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="}}
	later := b.client.MustEnqueue(t, laterStep)

	p := openUI(t, b.srv.URL)
	stuckRow := fmt.Sprintf(`#steps tbody tr[data-step-id="%d"]`, stuck)
	p.do("show steps of any age", append(anyAge(),
		chromedp.WaitVisible(chromedp.CSS(stuckRow)),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#scheduled tbody tr[data-step-id="%d"]`, later))),
	)...)
	if got, want := p.rows("steps"), []string{fmt.Sprint(stuck)}; !slices.Equal(got, want) {
		t.Errorf("stuck steps %q, want %q: step %d is scheduled 3 h ahead", got, want, later)
	}

	p.do("cancel the stuck step",
		chromedp.Click(chromedp.CSS(stuckRow)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li:nth-child(2)`)),
		chromedp.Click(chromedp.ID("cancel-step")),
		chromedp.WaitNotPresent(chromedp.CSS(stuckRow)),
	)
	status, got := b.client.V1(t, http.MethodGet, "/v1/steps", nil)
	listed := false
	for _, st := range got["steps"].([]any) {
		listed = listed || st.(map[string]any)["step_id"] == float64(stuck)
	}
	if status != http.StatusOK || !listed {
		t.Errorf("GET /v1/steps after the cancel: %d %v, want step %d still listed (not collected yet)", status, got, stuck)
	}
	// a step stored since shows that the refresh's listing was rendered
	afterStep, _ := testkit.V1FanOut("UIAFTER", 1)
	after := b.client.MustEnqueue(t, afterStep)
	p.do("refresh",
		chromedp.Click(chromedp.ID("refresh")),
		chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#steps tbody tr[data-step-id="%d"]`, after))),
	)
	if got, want := p.rows("steps"), []string{fmt.Sprint(after)}; !slices.Equal(got, want) {
		t.Errorf("stuck steps %q after a refresh, want %q: step %d was cancelled", got, want, stuck)
	}
}
