package main_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

// The README's round trip, examples/roundtrip.sh, works against the real
// api as a reader would paste it: the step is stored, the signed webhook
// is answered 200, and the step has nothing outstanding after.
func TestTheREADMERoundTripScriptWorks(t *testing.T) {
	testkit.RequireBinary(t, "curl", "base64", "openssl")
	db := testkit.NewDB(t, nil)
	rs := testkit.StartRedis(t)
	const key, hmacKey = "roundtrip-key", "roundtrip-hmac"
	_, url := testkit.StartService(t, apiBin, testkit.ServiceEnv(db.DSN, rs.URL,
		"STEPCOLLECT_API_KEY="+key, "STEPCOLLECT_WEBHOOK_HMAC_KEY="+hmacKey), "listen")
	cmd := exec.Command("bash", "../../examples/roundtrip.sh")
	cmd.Env = append(cmd.Environ(), "STEPCOLLECT_API="+url, "STEPCOLLECT_API_KEY="+key, "STEPCOLLECT_WEBHOOK_HMAC_KEY="+hmacKey)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("examples/roundtrip.sh: %v\n%s", err, out)
	}
	for _, want := range []string{`{"step_id":`, `"outstanding_ids":1`, "200 (200: committed)", `"outstanding_ids":0`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("examples/roundtrip.sh printed no %q:\n%s", want, out)
		}
	}
	t.Logf("%s", out)
}
