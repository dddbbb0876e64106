package delivery

import (
	"errors"
	"fmt"
	"testing"
)

// Only a 4xx about the event itself says the receiver is up; the answers
// that refuse any request, and no answer at all, do not.
func TestJudgedIsA4xxAboutTheEvent(t *testing.T) {
	t.Parallel()
	for code, want := range map[int]bool{
		400: true, 404: true, 409: true, 410: true, 413: true, 422: true,
		401: false, 403: false, 407: false, 408: false, 429: false,
		301: false, 307: false, 500: false, 502: false, 503: false, 504: false,
	} {
		err := fmt.Errorf("posting: %w", &statusError{code, fmt.Sprintf("callback answered %d", code)})
		if got := judged(err); got != want {
			t.Errorf("judged(%d) = %v, want %v", code, got, want)
		}
	}
	if judged(errors.New("dial tcp: connection refused")) {
		t.Error("a refused connection taken for an answer about the event")
	}
}
