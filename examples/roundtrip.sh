#!/usr/bin/env bash
# One round trip through a running stepcollect (`make run` in another
# terminal): store a one-command step for one device as a workflow engine
# would, answer the command as NanoMDM's webhook would, and read the step
# back. Needs curl, base64 and (with a webhook HMAC key) openssl.
#
#   STEPCOLLECT_API_KEY=<the key make run printed> examples/roundtrip.sh
set -euo pipefail
api=${STEPCOLLECT_API:-http://127.0.0.1:9100}
key=${STEPCOLLECT_API_KEY:?set STEPCOLLECT_API_KEY to the key make run printed}
hmac_key=${STEPCOLLECT_WEBHOOK_HMAC_KEY:-}
dev=DEV-ROUNDTRIP-1
uuid=roundtrip-$(date +%s)-$$

# The MDM command the engine sends through NanoMDM: DeviceInformation.
command=$(base64 -w0 <<PLIST
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
<key>Command</key><dict><key>RequestType</key><string>DeviceInformation</string>
<key>Queries</key><array><string>SerialNumber</string><string>DeviceName</string></array></dict>
<key>CommandUUID</key><string>$uuid</string>
</dict></plist>
PLIST
)

echo "1. POST /v1/steps: one step, one command ($uuid), to $dev"
step=$(curl -fsS -H "Authorization: Bearer $key" -d @- "$api/v1/steps" <<JSON
{"workflow_name": "io.example.roundtrip", "instance_id": "$uuid", "step_name": "query",
 "ids": ["$dev"],
 "commands": [{"command_uuid": "$uuid", "request_type": "DeviceInformation", "command": "$command"}]}
JSON
)
echo "   $step"
id=$(sed -E 's/.*"step_id": *([0-9]+).*/\1/' <<<"$step")

echo "2. GET /v1/steps/$id before the device answers"
echo "   $(curl -fsS -H "Authorization: Bearer $key" "$api/v1/steps/$id")"

# The device's answer, as NanoMDM v0.9's webhook posts it.
result=$(base64 -w0 <<PLIST
<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
<key>CommandUUID</key><string>$uuid</string>
<key>Status</key><string>Acknowledged</string>
<key>UDID</key><string>$dev</string>
<key>QueryResponses</key><dict><key>SerialNumber</key><string>C02ROUNDTRIP</string><key>DeviceName</key><string>Round trip</string></dict>
</dict></plist>
PLIST
)
body=$(printf '{"topic":"mdm.Connect","event_id":"%s","created_at":"%s","acknowledge_event":{"udid":"%s","status":"Acknowledged","command_uuid":"%s","raw_payload":"%s"}}' \
  "$uuid-1" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$dev" "$uuid" "$result")
sig=()
if [ -n "$hmac_key" ]; then
  sig=(-H "X-Hmac-Signature: $(printf %s "$body" | openssl dgst -sha256 -hmac "$hmac_key" -binary | base64 -w0)")
fi
echo "3. POST /webhook: $dev answers $uuid (Acknowledged)"
code=$(curl -sS -o /dev/null -w '%{http_code}' "${sig[@]}" -H 'Content-Type: application/json' -d "$body" "$api/webhook")
echo "   $code (200: committed)"
[ "$code" = 200 ] || { echo "roundtrip: the webhook answered $code, want 200" >&2; exit 1; }

echo "4. GET /v1/steps/$id after: 0 outstanding, or 404 once the worker collected it"
curl -sS -H "Authorization: Bearer $key" -w '   (%{http_code})\n' "$api/v1/steps/$id"
echo "   The step.completed event waits in the outbox for the worker's -callback-url."
