package main_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"
	"github.com/micromdm/plist"
	"github.com/smallstep/pkcs7"
)

// mac is one simulated Mac: it answers the commands NanoCMD enqueued for
// it, as a Mac does, through NanoMDM's own webhook sender. It keeps what a
// Mac would: the profiles installed, and FileVault's state with the
// personal recovery key (PRK), escrowed encrypted to the certificate of the
// FileVault profile and, on rotation, to the command's reply certificate.
type mac struct {
	id   string
	name string // its DeviceName; "Mac <id>" when empty

	mu         sync.Mutex
	answered   map[string]bool // command UUIDs
	profiles   []installedProfile
	payloads   [][]byte          // of every InstallProfile, in order
	escrowCert *x509.Certificate // from the FileVault profile's pkcs1 payload
	fdeEnabled bool
	prk        string
	prks       []string // every PRK this Mac had, in order
	wrongPRK   []string // RotateFileVaultKey passwords that were not the PRK
}

type installedProfile struct{ Identifier, UUID string }

func newMac(id string) *mac { return &mac{id: id, answered: map[string]bool{}} }

// command is the part of an enqueued command plist a Mac reads.
type command struct {
	CommandUUID string
	Command     struct {
		RequestType                string
		Payload                    []byte
		Identifier                 string
		PIN                        string
		Queries                    []string
		ManifestURL                string
		ReplyEncryptionCertificate []byte
		FileVaultUnlock            struct{ Password string }
	}
}

// profilePayload is the part of a configuration profile a Mac reads.
type profilePayload struct {
	PayloadIdentifier string
	PayloadUUID       string
	PayloadContent    []struct {
		PayloadType    string
		PayloadContent []byte
	}
}

// enableFileVault turns FileVault on: the next SecurityInfo says so, with
// a new PRK encrypted to the FileVault profile's certificate.
func (m *mac) enableFileVault() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fdeEnabled = true
	m.prk = newPRK()
	m.prks = append(m.prks, m.prk)
}

func (m *mac) currentPRK() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.prk
}

func newPRK() string {
	b := make([]byte, 12)
	rand.Read(b)
	s := strings.ToUpper(hex.EncodeToString(b))
	return strings.Join([]string{s[0:4], s[4:8], s[8:12], s[12:16], s[16:20], s[20:24]}, "-")
}

// result is the Mac's answer to the command plist raw.
func (m *mac) result(raw []byte) ([]byte, error) {
	var c command
	if err := plist.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%s: reading command: %w", m.id, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	res := map[string]any{"CommandUUID": c.CommandUUID, "Status": "Acknowledged", "UDID": m.id}
	switch c.Command.RequestType {
	case "DeviceInformation":
		name := m.name
		if name == "" {
			name = "Mac " + m.id
		}
		res["QueryResponses"] = map[string]any{
			"UDID": m.id, "SerialNumber": "SN" + m.id, "Model": "Mac14,2", "ModelName": "MacBook Air",
			"DeviceName": name, "OSVersion": "14.4.1", "BuildVersion": "23E224",
		}
	case "SecurityInfo":
		info := map[string]any{"FDE_Enabled": m.fdeEnabled, "SystemIntegrityProtectionEnabled": true}
		if m.fdeEnabled && m.escrowCert != nil {
			cms, err := pkcs7.Encrypt([]byte(m.prk), []*x509.Certificate{m.escrowCert})
			if err != nil {
				return nil, fmt.Errorf("%s: encrypting the PRK: %w", m.id, err)
			}
			info["FDE_PersonalRecoveryKeyCMS"] = cms
		}
		res["SecurityInfo"] = info
	case "ProfileList":
		list := []any{}
		for _, p := range m.profiles {
			list = append(list, map[string]any{"PayloadIdentifier": p.Identifier, "PayloadUUID": p.UUID})
		}
		res["ProfileList"] = list
	case "InstallProfile":
		m.payloads = append(m.payloads, c.Command.Payload)
		var p profilePayload
		if err := plist.Unmarshal(c.Command.Payload, &p); err != nil {
			return nil, fmt.Errorf("%s: reading the profile of %s: %w", m.id, c.CommandUUID, err)
		}
		m.profiles = slices.DeleteFunc(m.profiles, func(i installedProfile) bool { return i.Identifier == p.PayloadIdentifier })
		m.profiles = append(m.profiles, installedProfile{p.PayloadIdentifier, p.PayloadUUID})
		for _, pc := range p.PayloadContent {
			if pc.PayloadType == "com.apple.security.pkcs1" {
				cert, err := x509.ParseCertificate(pc.PayloadContent)
				if err != nil {
					return nil, fmt.Errorf("%s: the FileVault profile's certificate: %w", m.id, err)
				}
				m.escrowCert = cert
			}
		}
	case "RemoveProfile":
		m.profiles = slices.DeleteFunc(m.profiles, func(i installedProfile) bool { return i.Identifier == c.Command.Identifier })
	case "CertificateList":
		res["CertificateList"] = []any{}
	case "DeviceLock":
		res["MessageResult"] = "locked with " + c.Command.PIN
	case "RotateFileVaultKey":
		if c.Command.FileVaultUnlock.Password != m.prk {
			// a Mac refuses to rotate without the current PRK
			m.wrongPRK = append(m.wrongPRK, c.Command.FileVaultUnlock.Password)
			res["Status"] = "Error"
			res["ErrorChain"] = []any{map[string]any{"ErrorCode": 12081, "ErrorDomain": "MCMDMErrorDomain", "LocalizedDescription": "wrong PRK"}}
			break
		}
		cert, err := x509.ParseCertificate(c.Command.ReplyEncryptionCertificate)
		if err != nil {
			return nil, fmt.Errorf("%s: the reply certificate of %s: %w", m.id, c.CommandUUID, err)
		}
		m.prk = newPRK()
		m.prks = append(m.prks, m.prk)
		cms, err := pkcs7.Encrypt([]byte(m.prk), []*x509.Certificate{cert})
		if err != nil {
			return nil, fmt.Errorf("%s: encrypting the new PRK: %w", m.id, err)
		}
		res["RotateResult"] = map[string]any{"EncryptedNewRecoveryKey": cms}
	case "InstallApplication", "DeviceConfigured":
	default:
		return nil, fmt.Errorf("%s: no answer for %s", m.id, c.Command.RequestType)
	}
	return plist.MarshalIndent(res, "\t")
}

// answer sends the Mac's result for the enqueued command c through
// NanoMDM's webhook sender, signed as NanoMDM signs with -webhook-hmac-key.
func (m *mac) answer(sender *webhook.Webhook, f *fakeNanoMDM, c enqueued) error {
	raw := f.command(c.UUID)
	if raw == nil {
		return fmt.Errorf("%s: command %s (%s) was never enqueued", m.id, c.UUID, c.RequestType)
	}
	res, err := m.result(raw)
	if err != nil {
		return err
	}
	r := mdm.NewRequestWithContext(context.Background(), nil)
	r.EnrollID = &mdm.EnrollID{ID: m.id, Type: mdm.Device}
	var status struct{ Status string }
	plist.Unmarshal(res, &status)
	if _, err := sender.CommandAndReportResults(r, &mdm.CommandResults{
		Enrollment: mdm.Enrollment{UDID: m.id}, CommandUUID: c.UUID, Status: status.Status, Raw: res,
	}); err != nil {
		return fmt.Errorf("%s: answering %s (%s): %w", m.id, c.UUID, c.RequestType, err)
	}
	m.mu.Lock()
	m.answered[c.UUID] = true
	m.mu.Unlock()
	return nil
}

// pending are the commands enqueued for the Mac it has not answered.
func (m *mac) pending(f *fakeNanoMDM) []enqueued {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []enqueued
	for _, c := range f.commands(m.id) {
		if !m.answered[c.UUID] {
			out = append(out, c)
		}
	}
	return out
}

// drain answers every command enqueued for the Macs, and those the answers
// enqueue in turn, until none is left, and returns the request types it
// answered, by Mac, in order.
func drain(t *testing.T, sender *webhook.Webhook, f *fakeNanoMDM, macs ...*mac) map[string][]string {
	t.Helper()
	got := map[string][]string{}
	for {
		n := 0
		for _, m := range macs {
			for _, c := range m.pending(f) {
				if err := m.answer(sender, f, c); err != nil {
					t.Fatal(err)
				}
				got[m.id] = append(got[m.id], c.RequestType)
				n++
			}
		}
		if n == 0 {
			return got
		}
	}
}

// idle sends the Mac's Idle (no more commands) through NanoMDM's sender.
func (m *mac) idle(sender *webhook.Webhook) error {
	r := mdm.NewRequestWithContext(context.Background(), nil)
	r.EnrollID = &mdm.EnrollID{ID: m.id, Type: mdm.Device}
	raw := fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>Status</key><string>Idle</string><key>UDID</key><string>%s</string></dict></plist>`, m.id)
	_, err := sender.CommandAndReportResults(r, &mdm.CommandResults{Enrollment: mdm.Enrollment{UDID: m.id}, Status: "Idle", Raw: raw})
	return err
}

// authenticate sends the Mac's Authenticate check-in (a re-enrollment
// starts with it) through NanoMDM's sender.
func (m *mac) authenticate(sender *webhook.Webhook) error {
	r := mdm.NewRequestWithContext(context.Background(), nil)
	r.EnrollID = &mdm.EnrollID{ID: m.id, Type: mdm.Device}
	raw := fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>MessageType</key><string>Authenticate</string><key>Topic</key><string>com.apple.mgmt.test</string><key>UDID</key><string>%s</string></dict></plist>`, m.id)
	return sender.Authenticate(r, &mdm.Authenticate{Enrollment: mdm.Enrollment{UDID: m.id}, MessageType: mdm.MessageType{MessageType: "Authenticate"}, Raw: raw})
}

// tally is NanoMDM's TokenUpdate count: 1, the enrolling TokenUpdate.
type tally int

func (n tally) RetrieveTokenUpdateTally(context.Context, string) (int, error) { return int(n), nil }

// enroll sends the Mac's first TokenUpdate (NanoMDM's tally 1: enrolling),
// awaiting configuration, through NanoMDM's sender.
func (m *mac) enroll(url string) error {
	sender := webhook.New(url, webhook.WithHMACSecret([]byte(hmacKey)), webhook.WithTokenUpdateTalley(tally(1)))
	r := mdm.NewRequestWithContext(context.Background(), nil)
	r.EnrollID = &mdm.EnrollID{ID: m.id, Type: mdm.Device}
	r.ID = m.id
	raw := fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>AwaitingConfiguration</key><true/><key>MessageType</key><string>TokenUpdate</string>`+
		`<key>PushMagic</key><string>magic</string><key>Token</key><data>dG9rZW4=</data><key>Topic</key><string>com.apple.mgmt.test</string>`+
		`<key>UDID</key><string>%s</string></dict></plist>`, m.id)
	return sender.TokenUpdate(r, &mdm.TokenUpdate{Enrollment: mdm.Enrollment{UDID: m.id}, MessageType: mdm.MessageType{MessageType: "TokenUpdate"}, Raw: raw})
}
