package httpapi_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"
	"github.com/rs/zerolog"

	"github.com/stepcollect/stepcollect/httpapi"
	"github.com/stepcollect/stepcollect/internal/testkit"
	"github.com/stepcollect/stepcollect/metrics"
	"github.com/stepcollect/stepcollect/storage"
	stepmysql "github.com/stepcollect/stepcollect/storage/mysql"
)

const apiKey = "test-api-key"

var hmacKey = []byte("test-webhook-hmac-key")

// bundle is a migrated test database, the real storage on it (with the
// outbox, as the API runs it), and the handler behind an httptest server.
type bundle struct {
	db     *testkit.DB
	store  *stepmysql.Storage
	m      *metrics.Set
	srv    *httptest.Server
	client *testkit.Client // with the API key
}

type setupOpts struct {
	db      *testkit.DB // use this database instead of a new one
	storeDB *sql.DB     // the storage's pool, when not the test database's own
	sink    storage.ReleaseSink
	maxBody int64
	hmacKey []byte
	apiKey  *string
}

func setup(t *testing.T, o *setupOpts) *bundle {
	t.Helper()
	if o == nil {
		o = &setupOpts{}
	}
	db := o.db.OrNew(t)
	storeDB := o.storeDB
	if storeDB == nil {
		storeDB = db.DB
	}
	m := metrics.New(nil, nil)
	opts := []stepmysql.Option{stepmysql.WithOutbox(), stepmysql.WithObserver(m.Storage)}
	if o.sink != nil {
		opts = append(opts, stepmysql.WithReleaseSink(o.sink))
	}
	store := testkit.OpenStorage(t, storeDB, opts...)
	key := apiKey
	if o.apiKey != nil {
		key = *o.apiKey
	}
	h := httpapi.New(httpapi.Config{
		Store:          store,
		Logger:         zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel),
		APIKey:         key,
		WebhookHMACKey: o.hmacKey,
		MaxBody:        o.maxBody,
		Metrics:        m.API,
		Gatherer:       m.Registry,
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &bundle{db: db, store: store, m: m, srv: srv, client: testkit.NewClient(srv.URL, apiKey)}
}

// sender is NanoMDM's own webhook client, pointed at the handler.
func (b *bundle) sender(key []byte) *webhook.Webhook {
	var opts []webhook.Option
	if key != nil {
		opts = append(opts, webhook.WithHMACSecret(key))
	}
	return webhook.New(b.srv.URL+"/webhook", opts...)
}

func mdmRequest(id string) *mdm.Request {
	r := mdm.NewRequestWithContext(context.Background(), nil)
	r.EnrollID = &mdm.EnrollID{ID: id, Type: mdm.Device}
	return r
}

// sendResult reports one command result through NanoMDM's sender; an error
// means the handler did not answer 200.
func sendResult(w *webhook.Webhook, id, uuid, status string) error {
	_, err := w.CommandAndReportResults(mdmRequest(id), &mdm.CommandResults{
		Enrollment: mdm.Enrollment{UDID: id}, CommandUUID: uuid, Status: status, Raw: testkit.ResultPlist(id, uuid, status),
	})
	return err
}

func checkinPlist(udid, messageType string) []byte {
	return []byte(fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>MessageType</key><string>%s</string><key>UDID</key><string>%s</string><key>Topic</key><string>com.apple.mgmt.test</string></dict></plist>`, messageType, udid))
}

// enqueue stores a step through POST /v1/steps and returns its id.
func (b *bundle) enqueue(t *testing.T, wf string, ids []string, uuids ...string) int64 {
	t.Helper()
	var cmds []map[string]string
	for _, u := range uuids {
		cmds = append(cmds, map[string]string{"command_uuid": u, "request_type": "DeviceInformation", "command": "PHBsaXN0Lz4="})
	}
	status, body := b.client.V1(t, "POST", "/v1/steps", map[string]any{
		"workflow_name": wf, "instance_id": wf + "-1", "step_name": "query", "context": "Y3R4", "ids": ids, "commands": cmds,
	})
	if status != http.StatusCreated {
		t.Fatalf("enqueue: %d %v", status, body)
	}
	return int64(body["step_id"].(float64))
}

// snapshot is every table's checksum: equal snapshots, nothing written.
func snapshot(t *testing.T, db *sql.DB) string {
	t.Helper()
	rows, err := db.Query(`CHECKSUM TABLE steps, id_commands, step_commands, stepcollect_outbox, wf_status`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		var sum sql.NullInt64
		if err := rows.Scan(&name, &sum); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s=%d", name, sum.Int64))
	}
	return strings.Join(out, " ")
}
