package httpapi

import (
	"net/http"

	"github.com/stepcollect/stepcollect/internal/bodyadmit"
)

// How a webhook or /v1/steps body is admitted: internal/bodyadmit, under
// Config.MaxInflightBodyBytes (docs/reference.md, "Limits").

// DefaultBodyGrace and DefaultMinBodyRate are how a body must keep
// arriving: a 32 MiB result has 10 s + 128 s.
const (
	DefaultBodyGrace   = bodyadmit.DefaultGrace
	DefaultMinBodyRate = bodyadmit.DefaultMinRate
)

// bodyFunc is a handler that is given its body, read whole and admitted, or
// the reason it could not be (to answer with respondError).
type bodyFunc func(w http.ResponseWriter, r *http.Request, body []byte, err error)

// withBody reads the request's body as bodyadmit does and hands it to h,
// holding its decoding share until h returns.
func (s *Server) withBody(h bodyFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, release, err := s.body.Admit(w, r)
		if release != nil {
			defer release()
		}
		h(w, r, body, err)
	}
}
