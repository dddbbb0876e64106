package mdmsim

// What a device answers each command with: the response fields of the
// request types NanoCMD v0.7.1's workflows send (inventory, devinfolog,
// profile, certprof, cmdplan, lock, fvenable, fvrotate), named as
// github.com/jessepeterson/mdmcommands decodes them, and from a state that
// those commands change (installed profiles and their certificates,
// FileVault and its recovery key).

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/micromdm/plist"
	"github.com/smallstep/pkcs7"
)

// What every device says it is.
const (
	model        = "Mac14,2"
	modelName    = "MacBook Air"
	osVersion    = "14.4.1"
	buildVersion = "23E224"
)

// command is what a device reads of a command: the fields of every request
// type it gives more than a status to.
type command struct {
	CommandUUID string
	Command     struct {
		RequestType                string
		Queries                    []string
		Payload                    []byte // InstallProfile
		Identifier                 string // RemoveProfile
		ManagedOnly                bool   // ProfileList, CertificateList
		PIN                        string // DeviceLock
		KeyType                    string // RotateFileVaultKey
		FileVaultUnlock            struct{ Password string }
		ReplyEncryptionCertificate []byte
		ManifestURL                string // InstallApplication
	}
}

// state is what commands change on a device.
type state struct {
	profiles              []*profile
	awaitingConfiguration bool
	lockPIN               string
	apps                  []string
	fileVault             struct {
		pending       bool // a profile asked for it
		delay         int  // SecurityInfo answers left that still say off
		enabled       bool
		prk           string
		escrowCert    *x509.Certificate // FDERecoveryKeyEscrow's
		escrowProfile string
	}
}

// Installed is what commands left on a device, for a test to check a
// workflow by its effect.
type Installed struct {
	Profiles              []string // identifiers, in the order installed
	Apps                  []string // InstallApplication's, named by their manifest
	LockPIN               string   // DeviceLock's
	RecoveryKey           string   // FileVault's personal recovery key; "" while it is off
	AwaitingConfiguration bool
}

// Installed is what commands left on the device so far.
func (d *Device) Installed() Installed {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := Installed{Apps: slices.Clone(d.state.apps), LockPIN: d.state.lockPIN,
		AwaitingConfiguration: d.state.awaitingConfiguration}
	for _, p := range d.state.profiles {
		in.Profiles = append(in.Profiles, p.Identifier)
	}
	if d.state.fileVault.enabled {
		in.RecoveryKey = d.state.fileVault.prk
	}
	return in
}

type profile struct {
	Identifier, UUID, DisplayName string
	payloads                      []payload
	certs                         []listedCert
}

type listedCert struct {
	CommonName string
	IsIdentity bool
	Data       []byte
}

// payload is a profile's payload, as far as a device acts on it.
type payload struct {
	PayloadType                string
	PayloadIdentifier          string
	PayloadUUID                string
	PayloadDisplayName         string
	PayloadVersion             int
	PayloadContent             any // data (certificates) or a dictionary (SCEP)
	PayloadCertificateFileName string
	Enable                     string       // com.apple.MCX.FileVault2
	EncryptCertPayloadUUID     string       // com.apple.security.FDERecoveryKeyEscrow
	Subject                    [][][]string // ACME
}

type profilePlist struct {
	PayloadIdentifier  string
	PayloadUUID        string
	PayloadDisplayName string
	PayloadContent     []payload
}

// answer is the device's status and report for c.
func (d *Device) answer(c *command) (string, []byte) {
	typ := c.Command.RequestType
	r := map[string]any{"CommandUUID": c.CommandUUID, "UDID": d.UDID, "Status": "Acknowledged"}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.errorTypes[typ] {
		return d.fail(r, SimulatedError(typ))
	}
	if n, ok := d.behavior.NotNow[typ]; ok || d.behavior.NotNow[""] > 0 {
		if !ok {
			n = d.behavior.NotNow[""]
		}
		if d.notNow[c.CommandUUID] < n {
			d.notNow[c.CommandUUID]++
			r["Status"] = "NotNow"
			return "NotNow", encode(r)
		}
	}
	var err error
	switch typ {
	case "DeviceInformation":
		r["QueryResponses"] = d.queryResponses(c.Command.Queries)
	case "SecurityInfo":
		r["SecurityInfo"], err = d.securityInfo()
	case "ProfileList":
		r["ProfileList"] = d.profileList()
	case "InstallProfile":
		err = d.installProfile(c.Command.Payload)
	case "RemoveProfile":
		d.removeProfile(c.Command.Identifier)
	case "CertificateList":
		r["CertificateList"] = d.certificateList(c.Command.ManagedOnly)
	case "DeviceLock":
		d.state.lockPIN = c.Command.PIN
	case "RotateFileVaultKey":
		var result map[string]any
		if result, err = d.rotateFileVaultKey(c); result != nil {
			r["RotateResult"] = result
		}
	case "InstallApplication":
		app := strings.TrimSuffix(path.Base(c.Command.ManifestURL), path.Ext(c.Command.ManifestURL))
		d.state.apps = append(d.state.apps, app)
		r["Identifier"], r["State"] = app, "Queued"
	case "DeviceConfigured":
		d.state.awaitingConfiguration = false
	}
	// any other request type: Acknowledged, nothing more
	if err != nil {
		return d.fail(r, map[string]any{"ErrorCode": 12021, "ErrorDomain": "MCMDMErrorDomain",
			"LocalizedDescription": err.Error(), "USEnglishDescription": err.Error()})
	}
	return "Acknowledged", encode(r)
}

func (d *Device) fail(r map[string]any, item map[string]any) (string, []byte) {
	r["Status"] = "Error"
	r["ErrorChain"] = []any{item}
	return "Error", encode(r)
}

func encode(v any) []byte {
	b, err := plist.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("mdmsim: encoding an answer: %v", err)) // only maps of plist types are encoded
	}
	return b
}

func (d *Device) deviceName() string { return "Mac " + d.Serial }

func (d *Device) mac(i byte) string {
	sum := sha256.Sum256([]byte(d.UDID))
	return fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", sum[0]&0xfe|0x02, sum[1], sum[2], sum[3], sum[4], sum[5]^i)
}

// queryResponses answers the queried keys it knows (every one it knows
// when none is named), leaving out the others, as a Mac does.
func (d *Device) queryResponses(queries []string) map[string]any {
	all := map[string]any{
		"UDID": d.UDID, "SerialNumber": d.Serial, "Model": model, "ModelName": modelName, "ProductName": model,
		"DeviceName": d.deviceName(), "OSVersion": osVersion, "BuildVersion": buildVersion,
		"EthernetMAC": d.mac(0), "WiFiMAC": d.mac(1), "BluetoothMAC": d.mac(2),
		"IsAppleSilicon": true, "HasBattery": true, "IsMultiUser": false, "SupportsLOMDevice": false,
		"IsSupervised": false, "AwaitingConfiguration": d.state.awaitingConfiguration,
		"IsActivationLockSupported": true, "IsActivationLockEnabled": false, "IsMDMLostModeEnabled": false,
		"SystemIntegrityProtectionEnabled": true, "DeviceCapacity": 494.38, "AvailableDeviceCapacity": 301.7,
		"LocalHostName": "Mac-" + d.Serial, "HostName": "Mac-" + d.Serial + ".local",
		"SoftwareUpdateDeviceID": "J413AP",
	}
	if len(queries) == 0 {
		return all
	}
	out := make(map[string]any, len(queries))
	for _, q := range queries {
		if v, ok := all[q]; ok {
			out[q] = v
		}
	}
	return out
}

func (d *Device) securityInfo() (map[string]any, error) {
	fv := &d.state.fileVault
	if fv.pending {
		if fv.delay > 0 {
			fv.delay--
		} else {
			fv.pending, fv.enabled, fv.prk = false, true, newPRK()
		}
	}
	si := map[string]any{
		"FDE_Enabled": fv.enabled, "FDE_HasPersonalRecoveryKey": fv.enabled, "FDE_HasInstitutionalRecoveryKey": false,
		"SystemIntegrityProtectionEnabled": true, "AuthenticatedRootVolumeEnabled": true, "RemoteDesktopEnabled": false,
		"IsRecoveryLockEnabled": false, "BootstrapTokenAllowedForAuthentication": "allowed",
		"FirewallSettings":       map[string]any{"FirewallEnabled": false, "BlockAllIncoming": false, "StealthMode": false},
		"ManagementStatus":       map[string]any{"EnrolledViaDEP": false, "UserApprovedEnrollment": true, "IsUserEnrollment": false},
		"SecureBoot":             map[string]any{"SecureBootLevel": "full", "ExternalBootLevel": "disallowed"},
		"FirmwarePasswordStatus": map[string]any{"PasswordExists": false, "ChangePending": false},
	}
	if fv.enabled {
		si["FDE_PersonalRecoveryKeyDeviceKey"] = d.Serial
		if fv.escrowCert != nil {
			cms, err := pkcs7.Encrypt([]byte(fv.prk), []*x509.Certificate{fv.escrowCert})
			if err != nil {
				return nil, fmt.Errorf("encrypting the recovery key for escrow: %w", err)
			}
			si["FDE_PersonalRecoveryKeyCMS"] = cms
		}
	}
	return si, nil
}

// newPRK is a personal recovery key in a Mac's format: six groups of four.
func newPRK() string {
	const alphabet = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"
	b := make([]byte, 24)
	rand.Read(b)
	var s strings.Builder
	for i, c := range b {
		if i > 0 && i%4 == 0 {
			s.WriteByte('-')
		}
		s.WriteByte(alphabet[int(c)%len(alphabet)])
	}
	return s.String()
}

func (d *Device) rotateFileVaultKey(c *command) (map[string]any, error) {
	fv := &d.state.fileVault
	switch {
	case !fv.enabled:
		return nil, errors.New("FileVault is not enabled (simulated)")
	case c.Command.KeyType != "personal":
		return nil, fmt.Errorf("key type %q is not supported (simulated)", c.Command.KeyType)
	case c.Command.FileVaultUnlock.Password != fv.prk:
		return nil, errors.New("the existing recovery key was not accepted (simulated)")
	}
	fv.prk = newPRK()
	if len(c.Command.ReplyEncryptionCertificate) == 0 {
		return nil, nil
	}
	cert, err := x509.ParseCertificate(c.Command.ReplyEncryptionCertificate)
	if err != nil {
		return nil, fmt.Errorf("ReplyEncryptionCertificate: %w", err)
	}
	cms, err := pkcs7.Encrypt([]byte(fv.prk), []*x509.Certificate{cert})
	if err != nil {
		return nil, fmt.Errorf("encrypting the new recovery key: %w", err)
	}
	return map[string]any{"EncryptedNewRecoveryKey": cms}, nil
}

// installProfile installs (or replaces, by identifier) the profile in raw
// (a plist, or one signed in CMS) and acts on the payloads a Mac would:
// certificates, identities, FileVault and its recovery key escrow.
func (d *Device) installProfile(raw []byte) error {
	content := bytes.TrimSpace(raw)
	if !bytes.HasPrefix(content, []byte("<")) && !bytes.HasPrefix(content, []byte("bplist")) {
		p7, err := pkcs7.Parse(raw)
		if err != nil {
			return fmt.Errorf("the profile is neither a plist nor signed: %w", err)
		}
		content = p7.Content
	}
	var pp profilePlist
	if err := plist.Unmarshal(content, &pp); err != nil {
		return fmt.Errorf("the profile is malformed: %w", err)
	}
	if pp.PayloadIdentifier == "" || pp.PayloadUUID == "" {
		return errors.New("the profile has no PayloadIdentifier or PayloadUUID")
	}
	p := &profile{Identifier: pp.PayloadIdentifier, UUID: pp.PayloadUUID, DisplayName: pp.PayloadDisplayName, payloads: pp.PayloadContent}
	byUUID := map[string]*x509.Certificate{}
	var escrowTo string
	enableFileVault := false
	for _, pl := range pp.PayloadContent {
		switch pl.PayloadType {
		case "com.apple.security.pkcs1", "com.apple.security.root", "com.apple.security.pem":
			cert := parseCert(pl.PayloadContent)
			if cert == nil {
				return fmt.Errorf("payload %s: no certificate", pl.PayloadIdentifier)
			}
			byUUID[pl.PayloadUUID] = cert
			p.certs = append(p.certs, listedCert{CommonName: cert.Subject.CommonName, Data: cert.Raw})
		case "com.apple.security.scep", "com.apple.security.acme", "com.apple.security.pkcs12":
			cert, err := selfSignedIdentity(identityName(pl))
			if err != nil {
				return err
			}
			p.certs = append(p.certs, listedCert{CommonName: cert.Subject.CommonName, IsIdentity: true, Data: cert.Raw})
		case "com.apple.MCX.FileVault2":
			enableFileVault = enableFileVault || pl.Enable == "On"
		case "com.apple.security.FDERecoveryKeyEscrow":
			escrowTo = pl.EncryptCertPayloadUUID
		}
	}
	if escrowTo != "" && byUUID[escrowTo] == nil {
		return fmt.Errorf("FDERecoveryKeyEscrow: no certificate payload %s", escrowTo)
	}
	// valid: it replaces the one of its identifier
	d.removeProfile(p.Identifier)
	d.state.profiles = append(d.state.profiles, p)
	fv := &d.state.fileVault
	if escrowTo != "" {
		fv.escrowCert, fv.escrowProfile = byUUID[escrowTo], p.Identifier
	}
	if enableFileVault && !fv.enabled && !fv.pending {
		fv.pending, fv.delay = true, d.behavior.FileVaultDelay
	}
	return nil
}

// removeProfile removes the profile identifier if it is installed: a
// device answers Acknowledged either way.
func (d *Device) removeProfile(identifier string) {
	d.state.profiles = slices.DeleteFunc(d.state.profiles, func(p *profile) bool { return p.Identifier == identifier })
	if fv := &d.state.fileVault; fv.escrowProfile == identifier {
		fv.escrowCert, fv.escrowProfile = nil, ""
	}
}

func (d *Device) profileList() []any {
	out := []any{}
	for _, p := range d.state.profiles {
		content := []any{}
		for _, pl := range p.payloads {
			content = append(content, map[string]any{"PayloadType": pl.PayloadType, "PayloadVersion": 1,
				"PayloadIdentifier": pl.PayloadIdentifier, "PayloadUUID": pl.PayloadUUID})
		}
		out = append(out, map[string]any{"PayloadIdentifier": p.Identifier, "PayloadUUID": p.UUID,
			"PayloadDisplayName": p.DisplayName, "PayloadVersion": 1, "IsManaged": true, "PayloadContent": content})
	}
	return out
}

// certificateList is the certificates the installed profiles brought,
// and the device's identity unless only managed ones are asked for.
func (d *Device) certificateList(managedOnly bool) []any {
	out := []any{}
	if !managedOnly {
		out = append(out, map[string]any{"CommonName": d.Cert.Subject.CommonName, "IsIdentity": true, "Data": d.Cert.Raw})
	}
	for _, p := range d.state.profiles {
		for _, c := range p.certs {
			out = append(out, map[string]any{"CommonName": c.CommonName, "IsIdentity": c.IsIdentity, "Data": c.Data})
		}
	}
	return out
}

// parseCert reads a certificate payload's content: DER or PEM.
func parseCert(content any) *x509.Certificate {
	b, _ := content.([]byte)
	if block, _ := pem.Decode(b); block != nil {
		b = block.Bytes
	}
	cert, err := x509.ParseCertificate(b)
	if err != nil {
		return nil
	}
	return cert
}

// identityName is the common name of the identity an identity payload
// would get: its Subject's CN (SCEP has it in its content, ACME at its
// top), else its certificate file's or display name.
func identityName(pl payload) string {
	subject := pl.Subject
	if m, ok := pl.PayloadContent.(map[string]any); ok {
		if s, ok := m["Subject"].([]any); ok {
			subject = toSubject(s)
		}
	}
	for _, rdn := range subject {
		for _, atv := range rdn {
			if len(atv) == 2 && (atv[0] == "CN" || atv[0] == "2.5.4.3") {
				return atv[1]
			}
		}
	}
	if pl.PayloadCertificateFileName != "" {
		return strings.TrimSuffix(pl.PayloadCertificateFileName, path.Ext(pl.PayloadCertificateFileName))
	}
	return pl.PayloadDisplayName
}

// toSubject converts a decoded [[["CN", "x"]]] to its strings.
func toSubject(s []any) [][][]string {
	var out [][][]string
	for _, rdn := range s {
		r, _ := rdn.([]any)
		var atvs [][]string
		for _, atv := range r {
			a, _ := atv.([]any)
			var strs []string
			for _, v := range a {
				str, _ := v.(string)
				strs = append(strs, str)
			}
			atvs = append(atvs, strs)
		}
		out = append(out, atvs)
	}
	return out
}

// selfSignedIdentity stands in for the identity a SCEP, ACME or PKCS#12
// payload would get: a certificate for cn valid for a year.
func selfSignedIdentity(cn string) (*x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(1, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("making the identity %s: %w", cn, err)
	}
	return x509.ParseCertificate(der)
}
