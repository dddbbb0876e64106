package httpapi_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	nanostorage "github.com/micromdm/nanocmd/engine/storage"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/storage"
)

// panicStore panics where the API expects a step id.
type panicStore struct{ httpapi.Store }

func (panicStore) StoreStepID(context.Context, *nanostorage.StepEnqueuingWithConfig, time.Time) (int64, error) {
	panic("boom")
}

func (panicStore) StepStatus(context.Context, int64) (*storage.StepStatus, error) { return nil, nil }

func TestAPanicIsA500WithTheRequestIDLogged(t *testing.T) {
	var logs strings.Builder
	h := httpapi.New(httpapi.Config{Store: panicStore{}, APIKey: apiKey, Logger: zerolog.New(&logs)})
	srv := httptest.NewServer(h)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/v1/steps", strings.NewReader(`{"workflow_name":"w","instance_id":"i","ids":["A"],"commands":[{"command_uuid":"U","request_type":"R"}]}`))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set(httpapi.RequestIDHeader, "req-123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var eb struct {
		Error     string `json:"error"`
		RequestID string `json:"request_id"`
	}
	json.NewDecoder(resp.Body).Decode(&eb)
	resp.Body.Close()
	if resp.StatusCode != 500 || eb.RequestID != "req-123" || resp.Header.Get(httpapi.RequestIDHeader) != "req-123" {
		t.Errorf("%d %+v, want 500 carrying request id req-123", resp.StatusCode, eb)
	}
	if !strings.Contains(logs.String(), `"request_id":"req-123"`) || !strings.Contains(logs.String(), `"panic":"boom"`) {
		t.Errorf("panic not logged with its request id:\n%s", logs.String())
	}
}
