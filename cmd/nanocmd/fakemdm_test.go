package main_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/micromdm/plist"
)

// fakeNanoMDM is the NanoMDM API NanoCMD enqueues to (PUT
// /v1/enqueue/{ids} with the command plist, GET /v1/push/{ids}, HTTP Basic
// nanomdm:<key>): it answers 200 and records each enrollment's commands in
// the order enqueued. As strict as NanoMDM v0.9.0's storages: a command
// UUID is stored once, and a request that repeats it is refused whole
// (500, command_error), as is every request for an id in refuse.
type fakeNanoMDM struct {
	*httptest.Server
	mu     sync.Mutex
	cmds   map[string][]enqueued
	raw    map[string][]byte // command UUID: the command plist as enqueued
	pushes map[string]int    // enrollment: pushes asked for
	bad    []string
	refuse map[string]bool // ids whose enqueue is refused
}

type enqueued struct{ UUID, RequestType string }

func startFakeNanoMDM(t *testing.T, key string) *fakeNanoMDM {
	f := &fakeNanoMDM{cmds: map[string][]enqueued{}, raw: map[string][]byte{}, pushes: map[string]int{}, refuse: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /v1/enqueue/{ids}", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var c struct {
			CommandUUID string
			Command     struct{ RequestType string }
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		if err := plist.Unmarshal(body, &c); err != nil || c.CommandUUID == "" {
			f.bad = append(f.bad, fmt.Sprintf("%s: %q (%v)", r.URL.Path, body, err))
			http.Error(w, "no command", http.StatusBadRequest)
			return
		}
		if f.raw[c.CommandUUID] != nil {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintf(w, `{"command_error":"Error 1062 (23000): Duplicate entry '%s' for key 'commands.PRIMARY'"}`, c.CommandUUID)
			return
		}
		for _, id := range strings.Split(r.PathValue("ids"), ",") {
			if f.refuse[id] {
				// NanoMDM's MySQL storage enqueues in one transaction
				w.WriteHeader(http.StatusInternalServerError)
				fmt.Fprintf(w, `{"command_error":"Error 1452 (23000): Cannot add or update a child row: a foreign key constraint fails (enrollment %s)"}`, id)
				return
			}
		}
		f.raw[c.CommandUUID] = body
		for _, id := range strings.Split(r.PathValue("ids"), ",") {
			f.cmds[id] = append(f.cmds[id], enqueued{c.CommandUUID, c.Command.RequestType})
		}
		fmt.Fprintf(w, `{"command_uuid":%q,"request_type":%q}`, c.CommandUUID, c.Command.RequestType)
	})
	mux.HandleFunc("GET /v1/push/{ids}", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		for _, id := range strings.Split(r.PathValue("ids"), ",") {
			f.pushes[id]++
		}
		f.mu.Unlock()
		io.WriteString(w, `{}`)
	})
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "nanomdm" || p != key {
			f.mu.Lock()
			f.bad = append(f.bad, "unauthorized "+r.URL.Path)
			f.mu.Unlock()
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeNanoMDM) commands(id string) []enqueued {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]enqueued(nil), f.cmds[id]...)
}

// command is the plist of the command enqueued as uuid.
func (f *fakeNanoMDM) command(uuid string) []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.raw[uuid]
}

// pushed is how many pushes were asked for id.
func (f *fakeNanoMDM) pushed(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pushes[id]
}

// resultPlist is id's answer to c, as a Mac gives it: DeviceInformation's
// queried values, or SecurityInfo's dictionary.
func resultPlist(id string, c enqueued) []byte {
	var payload string
	switch c.RequestType {
	case "DeviceInformation":
		payload = fmt.Sprintf(`<key>QueryResponses</key><dict><key>BuildVersion</key><string>23E224</string><key>DeviceName</key><string>Mac %[1]s</string>`+
			`<key>Model</key><string>Mac14,2</string><key>OSVersion</key><string>14.4.1</string><key>SerialNumber</key><string>SN%[1]s</string></dict>`, id)
	case "SecurityInfo":
		payload = `<key>SecurityInfo</key><dict><key>FDE_Enabled</key><false/><key>SystemIntegrityProtectionEnabled</key><true/></dict>`
	}
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>CommandUUID</key><string>%s</string>%s<key>Status</key><string>Acknowledged</string><key>UDID</key><string>%s</string></dict></plist>`,
		c.UUID, payload, id)
}
