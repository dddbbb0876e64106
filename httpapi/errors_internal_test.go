package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/storage"
)

// A 503 says "nothing was written" only when that is so: after a COMMIT
// whose answer was lost and could not be settled, it says the work may be
// done.
func TestA503SaysWhetherAnythingMayHaveBeenWritten(t *testing.T) {
	for _, c := range []struct {
		err       error
		want, not string
	}{
		{errors.New("begin: dial tcp: connection refused"), "nothing was written", "may have been written"},
		{fmt.Errorf("%w: storing result: begin: dial tcp: connection refused", storage.ErrCommitUnknown), "may have been written", "nothing was written"},
	} {
		w := httptest.NewRecorder()
		respondError(w, httptest.NewRequest("POST", "/webhook", nil), c.err, "committing the result")
		var body struct{ Error string }
		json.NewDecoder(w.Body).Decode(&body)
		if w.Code != http.StatusServiceUnavailable || !strings.Contains(body.Error, c.want) || strings.Contains(body.Error, c.not) {
			t.Errorf("%v: %d %q, want 503 saying %q", c.err, w.Code, body.Error, c.want)
		}
	}
}
