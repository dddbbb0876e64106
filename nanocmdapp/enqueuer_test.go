package nanocmdapp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/micromdm/nanocmd/mdm/foss"
)

// Every enqueue request carries the command, however many ids the step has:
// NanoCMD v0.7.1's own enqueuer sent every request after the first 30 ids
// with an empty body.
func TestEveryEnqueueRequestCarriesTheCommand(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies []string
	ids := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		bodies = append(bodies, string(b))
		ids += len(strings.Split(strings.TrimPrefix(r.URL.Path, "/v1/enqueue/"), ","))
	}))
	defer srv.Close()
	fm, err := foss.NewFossMDM(srv.URL+"/v1/enqueue/", "key")
	if err != nil {
		t.Fatal(err)
	}
	const command = "<plist>the command</plist>"
	var all []string
	for i := range 70 {
		all = append(all, fmt.Sprintf("ID-%02d", i))
	}
	if err := (chunkedEnqueuer{FossMDM: fm, max: fossChunk}).Enqueue(context.Background(), all, []byte(command)); err != nil {
		t.Fatal(err)
	}
	if len(bodies) != 3 || ids != 70 {
		t.Fatalf("%d requests for %d ids, want 3 for 70", len(bodies), ids)
	}
	for i, b := range bodies {
		if b != command {
			t.Errorf("request %d of 3 carried %q, want the command", i+1, b)
		}
	}
}
