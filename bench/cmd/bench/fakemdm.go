package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/micromdm/plist"
)

// fakeMDM is the NanoMDM that NanoCMD enqueues its commands to, in the
// bench process: it answers NanoMDM's API (PUT /v1/enqueue/{ids} with the
// command plist as body, GET /v1/push/{ids}) 200 at once and records, per
// enrollment, the command UUIDs and request types enqueued to it, in
// order, for the bench to answer.
//
// NanoCMD v0.7.1 enqueues to at most 30 ids a request, one request after
// another, all from one bytes.Buffer of the command: the first chunk reads
// it to the end, so every later chunk of the same command arrives with an
// empty body. An empty body is attributed to the command of the request
// before it (NanoCMD sends one command's chunks in a row, and enqueues the
// commands of a step one after another), and counted.
type fakeMDM struct {
	URL    string // base, without the trailing slash
	apiKey string
	srv    *http.Server

	mu           sync.Mutex
	last         *enqueuedCommand // the command of the last request with a body
	cmds         map[string][]enqueuedCommand
	order        []string // enrollments in the order first enqueued to
	enqueues     int      // enqueue requests
	emptyBodies  int      // of which with an empty body
	unattributed int      // empty bodies with no command before them
	badBodies    int      // bodies that are not a command plist
	pushes       int      // push requests
	pushedIDs    int      // ids in them
	unauthorized int
}

type enqueuedCommand struct {
	UUID        string
	RequestType string
}

func startFakeMDM(apiKey string) (*fakeMDM, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &fakeMDM{URL: "http://" + ln.Addr().String(), apiKey: apiKey, cmds: map[string][]enqueuedCommand{}}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/enqueue/{ids}", f.enqueue)
	mux.HandleFunc("GET /v1/push/{ids}", f.push)
	f.srv = &http.Server{Handler: f.auth(mux)}
	go f.srv.Serve(ln)
	return f, nil
}

func (f *fakeMDM) close() { f.srv.Close() }

// auth checks NanoMDM's API authentication: HTTP Basic, user "nanomdm",
// the API key as password. A 401 shows a misconfigured run at once.
func (f *fakeMDM) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "nanomdm" || p != f.apiKey {
			f.mu.Lock()
			f.unauthorized++
			f.mu.Unlock()
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (f *fakeMDM) enqueue(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	ids := splitIDs(r.PathValue("ids"))
	var parsed *enqueuedCommand
	if len(body) > 0 {
		var c struct {
			CommandUUID string
			Command     struct{ RequestType string }
		}
		if err := plist.Unmarshal(body, &c); err == nil && c.CommandUUID != "" {
			parsed = &enqueuedCommand{UUID: c.CommandUUID, RequestType: c.Command.RequestType}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.enqueues++
	cmd := parsed
	switch {
	case len(body) == 0:
		f.emptyBodies++
		cmd = f.last
		if cmd == nil {
			f.unattributed++
		}
	case parsed == nil:
		f.badBodies++
	default:
		f.last = parsed
	}
	if cmd == nil {
		http.Error(w, "no command", http.StatusBadRequest)
		return
	}
	for _, id := range ids {
		if _, seen := f.cmds[id]; !seen {
			f.order = append(f.order, id)
		}
		f.cmds[id] = append(f.cmds[id], *cmd)
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"command_uuid":%q,"request_type":%q}`, cmd.UUID, cmd.RequestType)
}

func (f *fakeMDM) push(w http.ResponseWriter, r *http.Request) {
	ids := splitIDs(r.PathValue("ids"))
	f.mu.Lock()
	f.pushes++
	f.pushedIDs += len(ids)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{}`)
}

func splitIDs(s string) []string {
	var ids []string
	for _, id := range strings.Split(s, ",") {
		if id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// enrollments returns each enrollment enqueued to, in the order first
// enqueued to, with its commands in the order enqueued.
func (f *fakeMDM) enrollments() (ids []string, cmds map[string][]enqueuedCommand) {
	f.mu.Lock()
	defer f.mu.Unlock()
	cmds = make(map[string][]enqueuedCommand, len(f.cmds))
	for id, c := range f.cmds {
		cmds[id] = append([]enqueuedCommand(nil), c...)
	}
	return append([]string(nil), f.order...), cmds
}

// fakeMDMStats is what the fake NanoMDM saw, for the report.
type fakeMDMStats struct {
	Enqueues     int `json:"enqueue_requests"`
	EmptyBodies  int `json:"empty_bodies"`
	Unattributed int `json:"unattributed"`
	BadBodies    int `json:"bad_bodies"`
	Pushes       int `json:"push_requests"`
	PushedIDs    int `json:"pushed_ids"`
	Unauthorized int `json:"unauthorized"`
	Enrollments  int `json:"enrollments"`
	Commands     int `json:"commands"` // enrollment × command pairs enqueued
}

func (f *fakeMDM) stats() fakeMDMStats {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := fakeMDMStats{Enqueues: f.enqueues, EmptyBodies: f.emptyBodies, Unattributed: f.unattributed, BadBodies: f.badBodies,
		Pushes: f.pushes, PushedIDs: f.pushedIDs, Unauthorized: f.unauthorized, Enrollments: len(f.cmds)}
	for _, c := range f.cmds {
		s.Commands += len(c)
	}
	return s
}
