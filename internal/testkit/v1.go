package testkit

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Client speaks to an api as a workflow engine (/v1, with the API key) and
// as NanoMDM (/webhook) do.
type Client struct {
	URL    string // the api's base URL
	Key    string // the API key
	client *http.Client
}

// NewClient is a client of the api at url with API key key. Its
// connections are kept (64 per host), and a request gives up after a
// minute.
func NewClient(url, key string) *Client {
	return &Client{URL: url, Key: key, client: &http.Client{Timeout: time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
}

// WithTimeout sets how long one request may take.
func (c *Client) WithTimeout(d time.Duration) *Client {
	c.client.Timeout = d
	return c
}

// Post sends body to path (with the API key under /v1/) and returns the
// answer's status and body.
func (c *Client) Post(path string, body []byte) (int, []byte, error) {
	return c.do("POST", path, bytes.NewReader(body))
}

func (c *Client) do(method, path string, body io.Reader) (int, []byte, error) {
	req, err := http.NewRequest(method, c.URL+path, body)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if strings.HasPrefix(path, "/v1/") {
		req.Header.Set("Authorization", "Bearer "+c.Key)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// Webhook posts a NanoMDM webhook body.
func (c *Client) Webhook(body []byte) (int, []byte, error) { return c.Post("/webhook", body) }

// V1 makes one /v1 request (body nil, a string, or marshalled to JSON) and
// returns the status and the decoded JSON answer (nil when empty), failing
// t when there is no answer or it is not JSON.
func (c *Client) V1(t testing.TB, method, path string, body any) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	switch v := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(v)
	case []byte:
		rd = bytes.NewReader(v)
	default:
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		rd = bytes.NewReader(j)
	}
	status, raw, err := c.do(method, path, rd)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	if len(bytes.TrimSpace(raw)) == 0 {
		return status, nil
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: answer %d is not JSON: %q", method, path, status, raw)
	}
	return status, out
}

// Enqueue stores a step through POST /v1/steps and returns its id; any
// answer but 201 is an error.
func (c *Client) Enqueue(step any) (int64, error) {
	b, err := json.Marshal(step)
	if err != nil {
		return 0, err
	}
	status, raw, err := c.Post("/v1/steps", b)
	if err != nil || status != http.StatusCreated {
		return 0, fmt.Errorf("enqueue: %d %s %v", status, raw, err)
	}
	var out struct {
		StepID int64 `json:"step_id"`
	}
	if err := json.Unmarshal(raw, &out); err != nil {
		return 0, fmt.Errorf("enqueue: %s: %w", raw, err)
	}
	return out.StepID, nil
}

// MustEnqueue is Enqueue failing t on an error.
func (c *Client) MustEnqueue(t testing.TB, step any) int64 {
	t.Helper()
	id, err := c.Enqueue(step)
	if err != nil {
		t.Fatal(err)
	}
	return id
}
