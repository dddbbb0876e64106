package main_test

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/nanomdm"
)

// Every route of NanoHUB v0.2.0 answers here as there, with and without
// the API key: each binary on -storage inmem with -checkin, -migration and
// -auth-proxy-url, asked the same requests.
func TestEveryRouteAnswersAsNanoHUBv020s(t *testing.T) {
	ca, err := nanomdm.NewCA()
	if err != nil {
		t.Fatal(err)
	}
	caPath := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caPath, ca.PEM(), 0o600); err != nil {
		t.Fatal(err)
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer upstream.Close()
	start := func(bin string) string {
		addr := testkit.FreeAddr(t)
		p := testkit.StartProc(t, bin, nil, "-listen", addr, "-storage", "inmem", "-ca", caPath, "-api-key", apiKey,
			"-checkin", "-migration", "-auth-proxy-url", upstream.URL, "-cert-header", certHeader)
		testkit.AwaitHTTP(t, p, "http://"+addr+"/version", 60*time.Second)
		return "http://" + addr
	}
	theirs, ours := start(buildNanoHUB(t)), start(bins["nanohub"])
	status := func(base, method, path string, auth bool) int {
		req, _ := http.NewRequest(method, base+path, nil)
		if auth {
			req.SetBasicAuth("nanohub", apiKey)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// the comparison is not of two servers answering 404 to everything
	if got := status(ours, "GET", "/api/v1/ddm/sets", false); got != http.StatusUnauthorized {
		t.Errorf("GET /api/v1/ddm/sets without the key: %d, want 401", got)
	}
	if got := status(ours, "GET", "/api/v1/ddm/sets", true); got != http.StatusOK {
		t.Errorf("GET /api/v1/ddm/sets with the key: %d, want 200", got)
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/version"}, {"PUT", "/mdm"}, {"PUT", "/checkin"}, {"GET", "/authproxy/x"}, {"PUT", "/migration"},
		{"GET", "/api/v1/nanomdm/version"}, {"PUT", "/api/v1/nanomdm/enqueue/A"}, {"GET", "/api/v1/nanomdm/push/A"},
		{"GET", "/api/v1/nanomdm/pushcert"}, {"PUT", "/api/v1/nanomdm/pushcert"},
		{"POST", "/api/v1/nanocmd/workflow/io.micromdm.wf.devinfolog.v1/start"}, {"GET", "/api/v1/nanocmd/event/x"},
		{"GET", "/api/v1/nanocmd/profile"}, {"GET", "/api/v1/nanocmd/profile/x"}, {"GET", "/api/v1/nanocmd/fvenable/profiletemplate"},
		{"GET", "/api/v1/nanocmd/cmdplan/x"}, {"GET", "/api/v1/nanocmd/inventory"},
		{"GET", "/api/v1/ddm/declarations"}, {"GET", "/api/v1/ddm/declarations/x"}, {"GET", "/api/v1/ddm/sets"},
		{"GET", "/api/v1/ddm/set-declarations/x"}, {"GET", "/api/v1/ddm/enrollment-sets/x"}, {"GET", "/api/v1/ddm/declaration-items?id=x"},
		{"GET", "/api/v1/ddm/tokens?id=x"}, {"GET", "/api/v1/ddm/declaration/x/y?id=x"}, {"GET", "/api/v1/ddm/declaration-status/x"},
		{"GET", "/nothing"},
	} {
		for _, auth := range []bool{false, true} {
			if got, want := status(ours, r.method, r.path, auth), status(theirs, r.method, r.path, auth); got != want {
				t.Errorf("%s %s (key: %v): %d, NanoHUB v0.2.0 answers %d", r.method, r.path, auth, got, want)
			}
		}
	}
}
