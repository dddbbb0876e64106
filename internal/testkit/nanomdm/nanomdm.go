package nanomdm

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/micromdm/nanomdm/api"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// Module is the module NanoMDM's server is built from, at the version
// stepcollect's go.mod requires (its tool directive keeps the server's
// dependencies in go.sum).
const Module = "github.com/micromdm/nanomdm"

// DefaultCertHeader is the header Start has NanoMDM read the device's
// identity certificate from (-cert-header).
const DefaultCertHeader = "X-Client-Cert"

var built struct {
	once sync.Once
	path string
	err  error
}

// Binary builds NanoMDM's server once per test binary (without the race
// detector) and returns its path. Test binaries share one file per
// version under the temporary directory: each builds it (the build cache
// makes that a link) and renames it into place, so none removes a binary
// another runs and nothing piles up.
func Binary(t testing.TB) string {
	t.Helper()
	built.once.Do(func() { built.path, built.err = build() })
	if built.err != nil {
		t.Fatalf("building NanoMDM's server: %v", built.err)
	}
	return built.path
}

func build() (string, error) {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	list := exec.Command("go", "list", "-m", "-f", "{{.Version}}", Module)
	list.Dir = root
	version, err := list.Output()
	if err != nil {
		return "", fmt.Errorf("go list -m %s: %w", Module, err)
	}
	dir := filepath.Join(os.TempDir(), "stepcollect-nanomdm-"+strings.TrimSpace(string(version)))
	if err := os.MkdirAll(dir, 0o777); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nanomdm")
	tmp := fmt.Sprintf("%s.%d", bin, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, Module+"/cmd/nanomdm")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s/cmd/nanomdm: %v\n%s", Module, err, out)
	}
	return bin, os.Rename(tmp, bin)
}

// Options configure a NanoMDM server.
type Options struct {
	// Storage is -storage: "inmem" (the default), "file" (deprecated in
	// NanoMDM; Start adds the option that enables it), "filekv" or
	// "mysql".
	Storage string
	// DSN is -storage-dsn: a database's (mysql, see NewMySQLDB), or a
	// directory (file, filekv; a temporary one when empty).
	DSN string
	// WebhookURL is where NanoMDM posts every check-in and command
	// report (-webhook-url); none when empty.
	WebhookURL string
	// HMACKey signs the webhook's posts (-webhook-hmac-key).
	HMACKey string
	// CertHeader is -cert-header; DefaultCertHeader when empty.
	CertHeader string
	// Debug is -debug.
	Debug bool
	// Args are further flags.
	Args []string
	// Binary is the server's binary; Start builds it (Binary) when empty.
	Binary string
}

// Server is a NanoMDM server run by a test (or the bench), on 127.0.0.1
// and a free port, killed when the test ends (or by StartProcess's stop).
type Server struct {
	URL        string // http://127.0.0.1:<port>
	MDMURL     string // check-ins and command reports, /mdm
	EnqueueURL string // /v1/enqueue/, the ids after it comma-separated
	PushURL    string // /v1/push/
	APIKey     string // the API's basic auth password, user "nanomdm"
	CertHeader string
	CA         *CA
	Proc       *testkit.Proc
}

// APIUser is the basic auth user of NanoMDM's API.
const APIUser = "nanomdm"

// Start runs NanoMDM's server for t with a new CA and waits until it
// answers.
func Start(t testing.TB, o Options) *Server {
	t.Helper()
	if o.Binary == "" {
		o.Binary = Binary(t)
	}
	s, stop, err := StartProcess(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("nanomdm output:\n%s", s.Logs())
		}
	})
	return s
}

// StartProcess is Start outside a test (the bench's): o.Binary is
// required, dir holds the CA (and a file storage's default directory),
// and stop kills the server.
func StartProcess(dir string, o Options) (s *Server, stop func(), err error) {
	if o.Binary == "" {
		return nil, nil, errors.New("starting NanoMDM: no binary (Options.Binary)")
	}
	ca, err := NewCA()
	if err != nil {
		return nil, nil, err
	}
	caPath := filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caPath, ca.PEM(), 0o600); err != nil {
		return nil, nil, err
	}
	port, err := testkit.PickPort()
	if err != nil {
		return nil, nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s = &Server{
		URL:        "http://" + addr,
		APIKey:     "nanomdm-test-" + strconv.Itoa(os.Getpid()),
		CertHeader: cmp.Or(o.CertHeader, DefaultCertHeader),
		CA:         ca,
	}
	s.MDMURL, s.EnqueueURL, s.PushURL = s.URL+"/mdm", s.URL+"/v1/enqueue/", s.URL+"/v1/push/"
	if s.Proc, err = testkit.StartProcess(o.Binary, nil, args(dir, addr, s, o)...); err != nil {
		return nil, nil, fmt.Errorf("starting NanoMDM: %w", err)
	}
	stop = s.Proc.Kill
	if _, ok := testkit.Watch(time.Now().Add(30*time.Second), func() bool {
		resp, err := http.Get(s.URL + "/version")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}); !ok {
		state := s.Proc.Describe()
		stop()
		return nil, nil, fmt.Errorf("NanoMDM did not answer %s/version within 30s (%s):\n%s", s.URL, state, s.Logs())
	}
	return s, stop, nil
}

// args is NanoMDM's command line for o, listening on addr.
func args(dir, addr string, s *Server, o Options) []string {
	args := []string{"-listen", addr, "-api", s.APIKey, "-ca", filepath.Join(dir, "ca.pem"), "-cert-header", s.CertHeader}
	storage := cmp.Or(o.Storage, "inmem")
	args = append(args, "-storage", storage)
	switch storage {
	case "inmem":
		args = append(args, "-storage-dsn", "")
	case "file", "filekv":
		args = append(args, "-storage-dsn", cmp.Or(o.DSN, filepath.Join(dir, "db")))
		if storage == "file" {
			args = append(args, "-storage-options", "enable_deprecated=1")
		}
	default:
		args = append(args, "-storage-dsn", o.DSN)
	}
	if o.WebhookURL != "" {
		args = append(args, "-webhook-url", o.WebhookURL)
	}
	if o.HMACKey != "" {
		args = append(args, "-webhook-hmac-key", o.HMACKey)
	}
	if o.Debug {
		args = append(args, "-debug")
	}
	return append(args, o.Args...)
}

// Logs is everything NanoMDM wrote so far.
func (s *Server) Logs() string { return s.Proc.Logs() }

// APIResult is NanoMDM's answer to an enqueue or a push: its HTTP status,
// its body, and the body decoded (Status is the per-id results).
type APIResult struct {
	HTTPStatus int
	Body       []byte
	api.APIResult
}

// Enqueue PUTs command (a plist) to ids through the enqueue API, as
// NanoCMD and stepcollect do, and returns NanoMDM's answer whatever its
// status. Without an APNs certificate NanoMDM's push after the enqueue
// fails, so that a command enqueued is answered 500 (see the package doc).
func (s *Server) Enqueue(ctx context.Context, command []byte, ids ...string) (*APIResult, error) {
	return s.call(ctx, s.EnqueueURL+strings.Join(ids, ","), command)
}

// EnqueueNoPush is Enqueue with ?nopush=1: NanoMDM enqueues and does not
// try to push.
func (s *Server) EnqueueNoPush(ctx context.Context, command []byte, ids ...string) (*APIResult, error) {
	return s.call(ctx, s.EnqueueURL+strings.Join(ids, ",")+"?nopush=1", command)
}

// Push asks NanoMDM to push to ids.
func (s *Server) Push(ctx context.Context, ids ...string) (*APIResult, error) {
	return s.call(ctx, s.PushURL+strings.Join(ids, ","), nil)
}

func (s *Server) call(ctx context.Context, url string, body []byte) (*APIResult, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(APIUser, s.APIKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("PUT %s: %w", url, err)
	}
	defer resp.Body.Close()
	r := &APIResult{HTTPStatus: resp.StatusCode}
	if r.Body, err = io.ReadAll(resp.Body); err != nil {
		return r, fmt.Errorf("PUT %s: reading the answer: %w", url, err)
	}
	if err := json.Unmarshal(r.Body, &r.APIResult); err != nil {
		return r, fmt.Errorf("PUT %s: %d %q is not an API result: %w", url, r.HTTPStatus, r.Body, err)
	}
	return r, nil
}
