package mdmsim

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/micromdm/plist"
)

// Content types of the two kinds of request a device PUTs to the MDM URL:
// NanoMDM without -checkin tells them apart by this header alone.
const (
	CheckinContentType = "application/x-apple-aspen-mdm-checkin"
	ReportContentType  = "application/x-apple-aspen-mdm"
)

// Issuer issues device identity certificates from the CA the server
// trusts (testkit/nanomdm's CA does).
type Issuer interface {
	Issue(commonName string) (*x509.Certificate, error)
}

// Target is the MDM server devices talk to.
type Target struct {
	// MDMURL takes check-ins and command reports (NanoMDM's /mdm).
	MDMURL string
	// CertHeader is the header the identity certificate travels in, as a
	// TLS proxy would pass it: URL-escaped PEM (nginx's
	// $ssl_client_escaped_cert), which NanoMDM's -cert-header decodes.
	// None is sent when empty.
	CertHeader string
	// Client sends the requests; http.DefaultClient when nil. Devices of
	// a fleet share one (Fleet makes it).
	Client *http.Client
}

// Behavior is how a device departs from answering every command at once
// with Acknowledged.
type Behavior struct {
	// Errors are the request types answered with Status Error and an
	// ErrorChain (SimulatedError).
	Errors []string
	// NotNow is how many times each command of a request type is answered
	// NotNow before it is answered; the key "" counts for every type.
	NotNow map[string]int
	// ReauthenticateAfter, when positive, has the device check in again
	// with Authenticate and TokenUpdate at its first poll after answering
	// that many commands, once, as a Mac re-enrolled in place does
	// (NanoMDM then clears its queue).
	ReauthenticateAfter int
	// AwaitingConfiguration is sent in the enrollment's TokenUpdate (a
	// DEP enrollment before DeviceConfigured).
	AwaitingConfiguration bool
	// FileVaultDelay is how many SecurityInfo commands still report
	// FileVault off after a profile enabling it is installed (a Mac
	// enables it at the next logout).
	FileVaultDelay int
}

// SimulatedError is the ErrorChain item of a device's Error answers.
func SimulatedError(requestType string) map[string]any {
	msg := "The " + requestType + " command failed (simulated)."
	return map[string]any{"ErrorCode": 12021, "ErrorDomain": "MCMDMErrorDomain",
		"LocalizedDescription": msg, "USEnglishDescription": msg}
}

// Exchange is one thing a device sent and the server took: a check-in
// (MessageType set) or its answer to a command.
type Exchange struct {
	MessageType string // Authenticate or TokenUpdate; empty for a command
	CommandUUID string
	RequestType string
	Status      string // the answer's: Acknowledged, Error, NotNow
	At          time.Time
}

// Device is one simulated Mac: its identity certificate, its UDID and
// serial number, what it has installed, and what it exchanged.
type Device struct {
	UDID   string
	Serial string
	Topic  string
	Cert   *x509.Certificate

	target     Target
	behavior   Behavior
	errorTypes map[string]bool
	certHeader string    // the certificate, PEM URL-escaped once
	idle       []byte    // the Idle report, encoded once
	counters   *counters // the fleet's, or the device's own

	pollMu sync.Mutex // one poll at a time

	mu        sync.Mutex
	exchanges []Exchange
	notNow    map[string]int // command UUID → NotNow answers given
	answered  int
	reauthed  bool
	state     state
}

// DefaultTopic is the APNs topic devices enroll with.
const DefaultTopic = "com.apple.mgmt.External.stepcollect-test"

// NewDevice makes a device with UDID udid and an identity certificate
// from issuer.
func NewDevice(issuer Issuer, target Target, udid string, b Behavior) (*Device, error) {
	cert, err := issuer.Issue(udid)
	if err != nil {
		return nil, fmt.Errorf("issuing %s's identity certificate: %w", udid, err)
	}
	sum := sha256.Sum256([]byte(udid))
	d := &Device{
		UDID:       udid,
		Serial:     "SIM" + strings.ToUpper(hex.EncodeToString(sum[:5])),
		Topic:      DefaultTopic,
		Cert:       cert,
		target:     target,
		behavior:   b,
		errorTypes: map[string]bool{},
		certHeader: url.QueryEscape(string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))),
		notNow:     map[string]int{},
		counters:   &counters{},
	}
	for _, t := range b.Errors {
		d.errorTypes[t] = true
	}
	d.state.awaitingConfiguration = b.AwaitingConfiguration
	if d.idle, err = plist.Marshal(map[string]any{"Status": "Idle", "UDID": udid}); err != nil {
		return nil, err
	}
	return d, nil
}

// Enroll checks in with Authenticate, then TokenUpdate.
func (d *Device) Enroll(ctx context.Context) error {
	auth := map[string]any{
		"MessageType": "Authenticate", "UDID": d.UDID, "Topic": d.Topic, "SerialNumber": d.Serial,
		"Model": model, "ModelName": modelName, "ProductName": model, "DeviceName": d.deviceName(),
		"OSVersion": osVersion, "BuildVersion": buildVersion,
	}
	if err := d.checkin(ctx, auth); err != nil {
		return err
	}
	token := make([]byte, 32)
	rand.Read(token)
	tu := map[string]any{
		"MessageType": "TokenUpdate", "UDID": d.UDID, "Topic": d.Topic,
		"Token": token, "PushMagic": newUUID(), "AwaitingConfiguration": d.behavior.AwaitingConfiguration,
	}
	if err := d.checkin(ctx, tu); err != nil {
		return err
	}
	d.counters.enrolled.Add(1)
	return nil
}

func (d *Device) checkin(ctx context.Context, msg map[string]any) error {
	body, err := plist.Marshal(msg)
	if err != nil {
		return err
	}
	typ := msg["MessageType"].(string)
	if _, err := d.put(ctx, CheckinContentType, body); err != nil {
		return fmt.Errorf("%s %s: %w", d.UDID, typ, err)
	}
	d.record(Exchange{MessageType: typ})
	return nil
}

// Poll reports Idle and answers every command the server hands out, one
// after the other, until it hands out none; it returns how many it
// answered. A device due to re-authenticate does so first.
func (d *Device) Poll(ctx context.Context) (int, error) {
	d.pollMu.Lock()
	defer d.pollMu.Unlock()
	d.mu.Lock()
	reauth := d.behavior.ReauthenticateAfter > 0 && !d.reauthed && d.answered >= d.behavior.ReauthenticateAfter
	d.reauthed = d.reauthed || reauth
	d.mu.Unlock()
	if reauth {
		if err := d.Enroll(ctx); err != nil {
			return 0, fmt.Errorf("re-authenticating: %w", err)
		}
	}
	d.counters.polls.Add(1)
	next, err := d.put(ctx, ReportContentType, d.idle)
	n := 0
	for err == nil && len(bytes.TrimSpace(next)) > 0 {
		var c command
		if err := plist.Unmarshal(next, &c); err != nil {
			return n, fmt.Errorf("%s: decoding a command: %w\n%s", d.UDID, err, next)
		}
		if c.CommandUUID == "" || c.Command.RequestType == "" {
			return n, fmt.Errorf("%s: a command without CommandUUID or RequestType:\n%s", d.UDID, next)
		}
		status, answer := d.answer(&c)
		if next, err = d.put(ctx, ReportContentType, answer); err != nil {
			break
		}
		// recorded once the server took it: a test that sees it answered
		// and stops the device has not cut off its report
		d.record(Exchange{CommandUUID: c.CommandUUID, RequestType: c.Command.RequestType, Status: status})
		n++
		d.counters.answered(status)
	}
	if err != nil {
		return n, fmt.Errorf("%s: %w", d.UDID, err)
	}
	return n, nil
}

func (d *Device) record(e Exchange) {
	e.At = time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.exchanges = append(d.exchanges, e)
	if e.MessageType == "" && e.Status != "NotNow" {
		d.answered++
	}
}

// Exchanges is what the device sent so far, in order.
func (d *Device) Exchanges() []Exchange {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Exchange(nil), d.exchanges...)
}

// Answers are the statuses the device answered command uuid with, in
// order (NotNow, …, then its final answer).
func (d *Device) Answers(uuid string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, e := range d.exchanges {
		if e.CommandUUID == uuid {
			out = append(out, e.Status)
		}
	}
	return out
}

// Answered is the final answer (not NotNow) the device gave command uuid,
// if any.
func (d *Device) Answered(uuid string) (Exchange, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.exchanges {
		if e.CommandUUID == uuid && e.Status != "NotNow" {
			return e, true
		}
	}
	return Exchange{}, false
}

// put sends body and returns the answer's body: the next command, or
// nothing.
func (d *Device) put(ctx context.Context, contentType string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, d.target.MDMURL, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", contentType)
	if d.target.CertHeader != "" {
		req.Header.Set(d.target.CertHeader, d.certHeader)
	}
	client := d.target.Client
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() == nil { // not the caller giving up
			d.counters.failures.Add(1)
		}
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("PUT %s: %s: %s", d.target.MDMURL, resp.Status, bytes.TrimSpace(b))
	}
	if err != nil {
		d.counters.failures.Add(1)
		return nil, err
	}
	return b, nil
}

func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6], b[8] = b[6]&0x0f|0x40, b[8]&0x3f|0x80
	h := strings.ToUpper(hex.EncodeToString(b))
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
