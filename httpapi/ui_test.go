package httpapi_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/testkit"
)

// uiServer is the real handler, with the operator endpoints answered by
// a fake (ui_fake_test.go).
func uiServer(t *testing.T) (*httptest.Server, *fakeOps) {
	t.Helper()
	ops := newFakeOps(apiKey)
	h := httpapi.New(httpapi.Config{Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel), APIKey: apiKey})
	srv := httptest.NewServer(ops.wrap(h))
	t.Cleanup(srv.Close)
	return srv, ops
}

func TestUIPageNeedsTheKeyAndForbidsFraming(t *testing.T) {
	srv, _ := uiServer(t)
	get := func(path, pass string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", srv.URL+path, nil)
		if pass != "" {
			req.SetBasicAuth("operator", pass)
		}
		resp, err := (&http.Transport{}).RoundTrip(req) // no redirects followed
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, pass := range []string{"", "wrong"} {
		if resp := get("/ui/", pass); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /ui/ with password %q: %d, want 401", pass, resp.StatusCode)
		}
	}
	if resp := get("/ui/app.js", ""); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /ui/app.js without the key: %d, want 401", resp.StatusCode)
	}
	if got := get("/ui/", "").Header.Values("WWW-Authenticate"); !slices.Contains(got, `Basic realm="stepcollect", charset="UTF-8"`) {
		t.Errorf("GET /ui/ without the key challenges %q, want Basic too: the one a browser prompts for", got)
	}
	if resp := get("/ui", ""); resp.StatusCode/100 != 3 || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q, want a redirect to /ui/", resp.StatusCode, resp.Header.Get("Location"))
	}
	resp := get("/ui/", apiKey)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET /ui/ with the key: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if got := resp.Header.Get("Content-Security-Policy"); !strings.HasPrefix(got, "default-src 'self'") {
		t.Errorf("Content-Security-Policy %q", got)
	}
	if got := resp.Header.Get("X-Frame-Options"); got != "DENY" {
		t.Errorf("X-Frame-Options %q", got)
	}
}

// A browser that holds the key for the page sends it with any request to
// the server, a form another site posts included: /v1 refuses those.
func TestUICrossSiteRequestsWithTheKeyAreRefused(t *testing.T) {
	srv, ops := uiServer(t)
	post := func(site string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", srv.URL+"/v1/delivery/pause", nil)
		req.SetBasicAuth("operator", apiKey)
		if site != "" {
			req.Header.Set("Sec-Fetch-Site", site)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := post("cross-site"); got != http.StatusForbidden {
		t.Errorf("cross-site POST with the key: %d, want 403", got)
	}
	if ops.called("POST /v1/delivery/pause") {
		t.Fatal("a cross-site POST paused delivery")
	}
	for _, site := range []string{"same-origin", ""} { // the page; a client that is not a browser
		if got := post(site); got != http.StatusOK {
			t.Errorf("POST with the key, Sec-Fetch-Site %q: %d, want 200", site, got)
		}
	}
}

// TestUIOperatorPageCancelsAStepAndDeliversAnEventAgainInChromium drives
// the page in headless Chromium as an operator would: the key typed into
// the browser's basic-auth prompt, a stuck step opened and cancelled, a
// held event delivered again, and an API error shown as its line.
func TestUIOperatorPageCancelsAStepAndDeliversAnEventAgainInChromium(t *testing.T) {
	testkit.RequireBinary(t, "chromium")
	srv, ops := uiServer(t)
	ctx := chromium(t)

	var dialogs struct {
		sync.Mutex
		msgs    []string
		prompts int // basic-auth prompts: the operator types the key once
	}
	// A listener must return at once: each answer goes from a goroutine.
	// A lost answer shows as a wait that times out below, so its error is
	// not logged (it may come after the test has ended).
	answer := func(f func() error) { go f() }
	err := chromedp.Listen(ctx, func(ev any) {
		switch e := ev.(type) {
		case *fetch.EventAuthRequired: // the prompt: the operator types the key
			dialogs.Lock()
			dialogs.prompts++
			dialogs.Unlock()
			answer(func() error {
				_, err := chromedp.Call(ctx, fetch.ContinueWithAuth, fetch.ContinueWithAuthParams{RequestID: e.RequestID,
					AuthChallengeResponse: &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: "operator", Password: apiKey}})
				return err
			})
		case *fetch.EventRequestPaused:
			answer(func() error {
				_, err := chromedp.Call(ctx, fetch.ContinueRequest, fetch.ContinueRequestParams{RequestID: e.RequestID})
				return err
			})
		case *page.EventJavascriptDialogOpening:
			dialogs.Lock()
			dialogs.msgs = append(dialogs.msgs, e.Message)
			dialogs.Unlock()
			answer(func() error {
				_, err := chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: true})
				return err
			})
		}
	})
	if err != nil {
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
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return s
	}
	yes := true
	if _, err := chromedp.Call(ctx, fetch.Enable, fetch.EnableParams{HandleAuthRequests: &yes}); err != nil {
		t.Fatal(err)
	}

	do("open the page",
		chromedp.Navigate(srv.URL+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS(`#steps tbody tr[data-step-id="103"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#held tbody tr[data-event-id="e-7"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#delivery-state.state-running`)),
	)
	dialogs.Lock()
	if dialogs.prompts != 1 {
		t.Errorf("%d basic-auth prompts, want 1: the page's calls to /v1 use the key typed for it", dialogs.prompts)
	}
	dialogs.Unlock()
	if !ops.called("GET /v1/steps?older_than=1h&limit=100") {
		t.Errorf("the steps table did not ask for steps older than the default hour: %v", ops.calls)
	}
	// data is text, never markup
	if got := text(`#steps tr[data-step-id="103"] td:nth-child(3)`); got != "<b>bold</b>" {
		t.Errorf("instance id shown as %q", got)
	}
	if got := text(`#held tr[data-event-id="e-8"] td:nth-child(7)`); !strings.HasPrefix(got, "<img") {
		t.Errorf("last error shown as %q", got)
	}
	made, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('img, b').length`))
	if err != nil || made != 0 {
		t.Errorf("%d elements made from the API's data (%v)", made, err)
	}

	do("open step 101",
		chromedp.Click(chromedp.CSS(`#steps tbody tr[data-step-id="101"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li`)),
		chromedp.Click(chromedp.ID(`outstanding-more`)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li:nth-child(5)`)),
	)
	if got, want := text("#outstanding"), strings.Join(outstandingIDs("101"), "\n"); got != want {
		t.Errorf("outstanding ids shown\n%q, want\n%q", got, want)
	}
	if !ops.called("GET /v1/steps/101/outstanding?limit=100&after=ENROLLMENT-101-3") {
		t.Errorf("the second page was not asked with the first page's next: %v", ops.calls)
	}

	do("cancel step 101",
		chromedp.Click(chromedp.ID(`cancel-step`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#steps tbody tr[data-step-id="101"]`)),
	)
	if !ops.called("DELETE /v1/steps/101") {
		t.Fatalf("no DELETE /v1/steps/101 after Cancel step: %v", ops.calls)
	}
	dialogs.Lock()
	if len(dialogs.msgs) != 1 || !strings.Contains(dialogs.msgs[0], "Cancel step 101") {
		t.Errorf("confirm dialogs %q, want one asking to cancel step 101", dialogs.msgs)
	}
	dialogs.Unlock()

	do("deliver an event that is gone",
		chromedp.Click(chromedp.CSS(`#held tbody tr[data-event-id="e-gone"] button`)),
		chromedp.WaitVisible(chromedp.ID(`held-error`)),
	)
	if got := text("#held-error"); got != "no such event: e-gone" {
		t.Errorf("error line %q, want the API's error", got)
	}
	do("deliver e-7 again",
		chromedp.Click(chromedp.CSS(`#held tbody tr[data-event-id="e-7"] button`)),
		chromedp.WaitNotPresent(chromedp.CSS(`#held tbody tr[data-event-id="e-7"]`)),
		chromedp.WaitNotVisible(chromedp.ID(`held-error`)),
	)
	if !ops.called("POST /v1/events/e-7/deliver") {
		t.Fatalf("no POST /v1/events/e-7/deliver after Deliver again: %v", ops.calls)
	}

	do("pause and resume delivery",
		chromedp.Click(chromedp.ID(`pause`)),
		chromedp.WaitVisible(chromedp.CSS(`#delivery-state.state-paused`)),
		chromedp.Click(chromedp.ID(`resume`)),
		chromedp.WaitVisible(chromedp.CSS(`#delivery-state.state-running`)),
	)
	if !ops.called("POST /v1/delivery/pause") || !ops.called("POST /v1/delivery/resume") {
		t.Errorf("no pause and resume: %v", ops.calls)
	}

	// the state the screenshot in docs/ shows: a step open, a notice
	do("open step 102",
		chromedp.Click(chromedp.CSS(`#steps tbody tr[data-step-id="102"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#outstanding li:nth-child(3)`)),
	)
	shot, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "operator-page.png")
	if os.Getenv("STEPCOLLECT_UPDATE_SCREENSHOT") == "1" {
		out = filepath.Join("..", "docs", "operator-page.png")
	}
	if err := os.WriteFile(out, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", out)
}

// chromium starts headless Chromium (no sandbox: CI runs as root) and
// returns a tab's context, closed with the test.
func chromium(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath("chromium"),
		chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900),
		chromedp.Flag("hide-scrollbars", true),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(cancel)
	// the whole browser lives under this bound (a wide one: 2 shared cores)
	ctx, cancel = context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}
