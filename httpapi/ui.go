package httpapi

import (
	"embed"
	"io/fs"
	"net/http"
)

// uiFiles is the operator page (docs/operations.md, "The operator page"):
// static HTML, JS and CSS that call the /v1 operator endpoints from the
// browser, so the page itself reads nothing from the storage.
//
//go:embed ui
var uiFiles embed.FS

var uiFS = func() http.Handler {
	sub, err := fs.Sub(uiFiles, "ui")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return http.StripPrefix("/ui/", http.FileServerFS(sub))
}()

// ui serves the operator page under /ui/ (ServeMux redirects /ui to /ui/).
// The page's scripts are its own files: the policy forbids inline script,
// any other origin, and framing (clickjacking of its buttons).
func (s *Server) ui(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; frame-ancestors 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
	uiFS.ServeHTTP(w, r)
}

// challenge answers a refused key with both schemes the key is accepted
// in. Basic is the one a browser prompts for, and it lets the browser send
// the key typed for the page with the page's calls to /v1 (same realm).
func challenge(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="stepcollect"`)
	w.Header().Add("WWW-Authenticate", `Basic realm="stepcollect", charset="UTF-8"`)
}

// crossSite refuses a browser's unsafe request sent from another site: a
// browser that holds the key for the page would otherwise send it with a
// forged form POST. Requests without Sec-Fetch-Site and Origin (every
// client that is not a browser) pass.
var crossSite = http.NewCrossOriginProtection()

func refuseCrossSite(w http.ResponseWriter, r *http.Request) bool {
	if err := crossSite.Check(r); err != nil {
		writeError(w, r, http.StatusForbidden, "refused: "+err.Error()+" (a browser may call /v1 only from this server's own pages)")
		return true
	}
	return false
}
