package main_test

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/micromdm/plist"

	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/internal/testkit/mdmsim"
)

// ddmCheckin sends d's DeclarativeManagement check-in for endpoint with
// data to the hub, as a Mac does, and returns the answer.
func (h *hub) ddmCheckin(t *testing.T, d *mdmsim.Device, endpoint string, data []byte) []byte {
	t.Helper()
	msg := map[string]any{"MessageType": "DeclarativeManagement", "UDID": d.UDID, "Endpoint": endpoint}
	if data != nil {
		msg["Data"] = data
	}
	body, err := plist.Marshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPut, h.base+"/mdm", bytes.NewReader(body))
	req.Header.Set("Content-Type", mdmsim.CheckinContentType)
	req.Header.Set(certHeader, url.QueryEscape(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d.Cert.Raw}))))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("DeclarativeManagement %s: %s %s", endpoint, resp.Status, b)
	}
	return b
}

// KMFDDM in the hub on MySQL: a declaration in a set assigned to a Mac
// sends it the DeclarativeManagement command (pushed best effort), the Mac
// fetches its declaration items, and the status report it sends is stored
// and served by KMFDDM's API.
func TestADeclarationSetReachesAMacAndItsStatusIsStored(t *testing.T) {
	h := startHub(t, hubOptions{N: 1})
	d := h.fleet.Devices()[0]
	h.mustAPI(t, http.MethodPut, "/api/v1/ddm/declarations",
		[]byte(`{"Type":"com.apple.configuration.management.test","Identifier":"com.example.test","Payload":{"Echo":"hello"}}`))
	h.mustAPI(t, http.MethodPut, "/api/v1/ddm/set-declarations/default?declaration=com.example.test", nil)
	h.mustAPI(t, http.MethodPut, "/api/v1/ddm/enrollment-sets/"+d.UDID+"?set=default", nil)
	h.awaitAnswered(t, d, 0, "DeclarativeManagement")

	var items struct {
		Declarations struct {
			Configurations []struct{ Identifier, ServerToken string }
		}
	}
	decodeJSON(t, h.ddmCheckin(t, d, "declaration-items", nil), &items)
	if c := items.Declarations.Configurations; len(c) != 1 || c[0].Identifier != "com.example.test" || c[0].ServerToken == "" {
		t.Fatalf("declaration items %+v, want com.example.test with its token", items)
	}
	if b := h.ddmCheckin(t, d, "declaration/configuration/com.example.test", nil); !strings.Contains(string(b), "hello") {
		t.Errorf("the declaration: %s", b)
	}
	status := fmt.Appendf(nil, `{"StatusItems":{"management":{"declarations":{"configurations":[`+
		`{"active":true,"identifier":"com.example.test","valid":"valid","server-token":%q}]}}},"Errors":[]}`,
		items.Declarations.Configurations[0].ServerToken)
	h.ddmCheckin(t, d, "status", status)
	testkit.WaitUntil(t, 10*time.Second, "the status stored", func() (bool, any) {
		b := h.mustAPI(t, http.MethodGet, "/api/v1/ddm/declaration-status/"+d.UDID, nil)
		return strings.Contains(string(b), "com.example.test") && strings.Contains(string(b), `"active":true`), string(b)
	})
}
