package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/storage"
)

// The operator page on the real endpoints and storage: an operator opens a
// step that is waiting, cancels it, and releases an event the receiver
// refused, and the database says both happened.
func TestUIOnTheRealEndpointsCancelsAStepAndReleasesAHeldEvent(t *testing.T) {
	testkit.RequireBinary(t, "chromium")
	b := setup(t, nil)
	bg := context.Background()

	// Three enrollments; UI-0000 answers, so its step.completed waits in
	// the outbox, and the receiver is taken to have refused it for good.
	step, ids := testkit.V1FanOut("UI", 3)
	stepID := b.client.MustEnqueue(t, step)
	if status, raw, err := b.client.Webhook(testkit.Acknowledged(ids[0], "UI-CMD")); err != nil || status != http.StatusOK {
		t.Fatalf("webhook: %d %s %v", status, raw, err)
	}
	page1, err := b.store.ListEvents(bg, "", 0, 10)
	if err != nil || len(page1.Events) != 1 {
		t.Fatalf("outbox: %+v %v, want the one step.completed", page1.Events, err)
	}
	ev := page1.Events[0]
	if err := b.store.HoldEvent(bg, storage.OutboxRef{ID: ev.ID, EventID: ev.EventID}, "callback answered 400 Bad Request"); err != nil {
		t.Fatal(err)
	}

	ctx := chromium(t)
	if err := chromedp.Listen(ctx, func(e any) {
		if _, ok := e.(*page.EventJavascriptDialogOpening); ok { // the confirm() before a cancel
			go chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
		}
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{
		Headers: network.Headers{"Authorization": "Bearer " + apiKey}}); err != nil {
		t.Fatal(err)
	}
	do := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		actx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(actx, actions...); err != nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			shown, _ := chromedp.Run(pctx, chromedp.Evaluate[string](`document.body.innerText`))
			t.Fatalf("%s: %v; the page shows:\n%s", what, err, shown)
		}
	}
	row := fmt.Sprintf(`#steps tbody tr[data-step-id="%d"]`, stepID)
	held := fmt.Sprintf(`#held tbody tr[data-event-id="%s"]`, ev.EventID)
	do("open the page and show steps of any age",
		chromedp.Navigate(b.srv.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(held)),
		chromedp.SetValue(chromedp.ID("age"), ""),
		chromedp.Evaluate[chromedp.Void](`document.getElementById('age').dispatchEvent(new Event('change'))`),
		chromedp.WaitVisible(chromedp.CSS(row)),
	)
	do("open the step and cancel it",
		chromedp.Click(chromedp.CSS(row)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li:nth-child(2)`)),
		chromedp.Click(chromedp.ID("cancel-step")),
		chromedp.WaitNotPresent(chromedp.CSS(row)),
	)
	if status, got := b.client.V1(t, http.MethodGet, fmt.Sprintf("/v1/steps/%d/outstanding", stepID), nil); status != http.StatusNotFound {
		t.Errorf("after Cancel step: GET /v1/steps/%d/outstanding %d %v, want 404 (no enrollment holds it)", stepID, status, got)
	}
	do("deliver the held event again",
		chromedp.Click(chromedp.CSS(held+" button")),
		chromedp.WaitNotPresent(chromedp.CSS(held)),
	)
	if got, err := b.store.ListEvents(bg, "held", 0, 10); err != nil || len(got.Events) != 0 {
		t.Errorf("held events after Deliver again: %+v %v, want none", got.Events, err)
	}
	if got, err := b.store.ListEvents(bg, "pending", 0, 10); err != nil || len(got.Events) != 1 || got.Events[0].Attempts != 0 {
		t.Errorf("pending events after Deliver again: %+v %v, want the released one, its attempts from 0", got.Events, err)
	}
}
