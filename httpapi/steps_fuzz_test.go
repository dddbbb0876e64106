package httpapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/storage"
)

// FuzzDecodeStep: whatever the body, decodeStep does not panic; an error is
// a one-line EInvalid or ETooLarge naming a field; a decoded step is within
// the limits; and the element count the limits are checked against is the
// one encoding/json sees. `go test -fuzz FuzzDecodeStep ./httpapi` explores.
func FuzzDecodeStep(f *testing.F) {
	lim := stepLimits{ids: 50, commands: 5, rows: 100}
	for _, s := range []string{
		// valid
		`{"workflow_name":"w","instance_id":"i","step_name":"s","context":"Y3R4","ids":["A","B"],"commands":[{"command_uuid":"U","request_type":"DeviceInformation","command":"PHBsaXN0Lz4="}]}`,
		`{"workflow_name":"w","instance_id":"i","ids":["A"],"commands":[{"command_uuid":"U","request_type":"R"}],"not_until":"2026-12-01T00:00:00Z","timeout":"2026-12-04T00:00:00+02:00"}`,
		// counts over the limits, and lists that are not what they seem
		`{"ids":[` + strings.Repeat(`"x",`, 60) + `"x"],"commands":[{}]}`,
		`{"ids":["A"],"commands":[` + strings.Repeat(`{},`, 9) + `{}]}`,
		`{"ids":[` + strings.Repeat(`"x",`, 30) + `"x"],"commands":[{},{},{},{}]}`,
		`{"commands":[{"command_uuid":"U"}],"ids":[` + strings.Repeat(`"",`, 200) + `""]}`,
		`{"ids":[[[[[["deep"]]]]],{"a":["]","\"",","]}],"commands":[]}`,
		`{"ids":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`,
		`{"ids":["a\\",",",\"]"],"commands":[ ]}`,
		`{"ids":[ ],"commands":null}`,
		// wrong types
		`{"ids":"A"}`, `{"ids":[1,2]}`, `{"commands":[{"command_uuid":7}]}`, `{"commands":{"command_uuid":"U"}}`,
		`{"workflow_name":["w"]}`, `{"not_until":1767225600}`, `[]`, `null`, `"step"`, `7`,
		// unknown fields, also inside a command
		`{"workflowName":"w"}`, `{"commands":[{"command_uuid":"U","uuid":"V"}]}`, "{\"ids\n\":[]}",
		// base64 junk
		`{"context":"!!"}`, `{"commands":[{"command_uuid":"U","command":"PHBsaXN0Lz4"}]}`, `{"context":"Y3R4\n"}`,
		// times out of range, or not times
		`{"timeout":"tomorrow"}`, `{"not_until":"0000-01-01T00:00:00Z"}`, `{"timeout":"9999-12-31T23:59:59Z"}`,
		`{"timeout":"2040-01-01T00:00:00Z","not_until":"1960-01-01T00:00:00Z"}`, `{"timeout":"2026-13-01T00:00:00Z"}`,
		// \u escapes of half a surrogate pair, and of whole ones
		`{"ids":["a\ud800b"]}`, `{"workflow_name":"\udc00","ids":["\ud83d\ude00"]}`, `{"commands":[{"command_uuid":"\\ud800\ud800"}]}`,
		`{"\ud800":1}`, `"\ud800"`, `{"ids":["\ud800\u`,
		// not JSON
		``, `{`, `{"ids":[`, "\x00\xff", `{"ids":["A"]} trailing`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		step, err := decodeStep(body, lim)
		if err != nil {
			if code := storage.ErrorCode(err); code != storage.EInvalid && code != storage.ETooLarge {
				t.Fatalf("error %q has code %q, want invalid or too_large", err, code)
			}
			if msg := err.Error(); strings.ContainsAny(msg, "\n\r") || !strings.Contains(msg, ": ") {
				t.Fatalf("error %q is not one line naming a field", msg)
			}
		} else if n, m := len(step.IDs), len(step.Commands); n > lim.ids || m > lim.commands || n*m > lim.rows {
			t.Fatalf("decoded %d ids x %d commands, over %+v", n, m, lim)
		}
		// countElements agrees with encoding/json about every list it is given.
		var probe struct{ IDs, Commands json.RawMessage }
		if json.Unmarshal(body, &probe) != nil {
			return
		}
		for _, raw := range []json.RawMessage{probe.IDs, probe.Commands} {
			var elems []json.RawMessage
			if len(raw) == 0 || json.Unmarshal(raw, &elems) != nil || raw[0] != '[' {
				continue
			}
			if got := countElements(raw); got != len(elems) {
				t.Fatalf("countElements(%s) = %d, encoding/json sees %d", raw, got, len(elems))
			}
		}
	})
}
