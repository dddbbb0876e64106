package testkit

import (
	"context"
	"encoding/base64"
	"fmt"
	"sync"
	"time"

	"github.com/micromdm/nanomdm/mdm"
	"github.com/micromdm/nanomdm/service/webhook"
)

// ResultPlist is a device's command result, as it reaches NanoMDM: status
// for command uuid, with query responses that name the device
// (SerialNumber SN-<udid>, DeviceName "<udid>'s Mac").
func ResultPlist(udid, uuid, status string) []byte {
	return fmt.Appendf(nil, `<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
<key>CommandUUID</key><string>%s</string>
<key>Status</key><string>%s</string>
<key>UDID</key><string>%s</string>
<key>QueryResponses</key><dict><key>SerialNumber</key><string>SN-%s</string><key>DeviceName</key><string>%s's Mac</string></dict>
</dict></plist>`, uuid, status, udid, udid, udid)
}

// WebhookBody is NanoMDM's webhook body (topic mdm.Connect) carrying raw as
// udid's answer to command uuid.
func WebhookBody(udid, uuid string, raw []byte) []byte {
	return fmt.Appendf(nil, `{"topic":"mdm.Connect","event_id":"%s-%s","created_at":%q,"acknowledge_event":{"udid":%q,"status":"Acknowledged","command_uuid":%q,"raw_payload":%q}}`,
		udid, uuid, time.Now().UTC().Format(time.RFC3339), udid, uuid, base64.StdEncoding.EncodeToString(raw))
}

// Acknowledged is the webhook body of udid acknowledging command uuid.
func Acknowledged(udid, uuid string) []byte {
	return WebhookBody(udid, uuid, ResultPlist(udid, uuid, "Acknowledged"))
}

// SendResults sends each of ids' acknowledgement of uuid at the same
// moment through NanoMDM's own webhook sender (signed with hmacKey unless
// nil) to url, and returns an error for each one not answered 200.
func SendResults(url string, hmacKey []byte, uuid string, ids []string) []error {
	var opts []webhook.Option
	if hmacKey != nil {
		opts = append(opts, webhook.WithHMACSecret(hmacKey))
	}
	sender := webhook.New(url, opts...)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	release := make(chan struct{})
	for _, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-release
			r := mdm.NewRequestWithContext(context.Background(), nil)
			r.EnrollID = &mdm.EnrollID{ID: id, Type: mdm.Device}
			_, err := sender.CommandAndReportResults(r, &mdm.CommandResults{
				Enrollment: mdm.Enrollment{UDID: id}, CommandUUID: uuid, Status: "Acknowledged", Raw: ResultPlist(id, uuid, "Acknowledged"),
			})
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("%s: %w", id, err))
				mu.Unlock()
			}
		}()
	}
	close(release)
	wg.Wait()
	return errs
}
