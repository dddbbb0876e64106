package main_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/testkit"
)

func TestAPIRejectsABadFlagInOneLineNamingIt(t *testing.T) {
	testkit.CheckRefuses(t, apiBin, []testkit.BadFlag{
		{Args: []string{"-listen", "nowhere"}, Want: "-listen: "},
		{Args: []string{"-mysql-dsn", "nonsense"}, Want: "-mysql-dsn: "},
		{Args: []string{"-redis-url", "ftp://x"}, Want: "-redis-url: "},
		{Env: "STEPCOLLECT_MIGRATE=maybe", Want: "-migrate: STEPCOLLECT_MIGRATE=\"maybe\""},
		{Args: []string{"-log-format", "xml"}, Want: "-log-format: "},
		{Args: []string{"-max-body-bytes", "10"}, Want: "-max-body-bytes: "},
	})
}

// A refused URL or DSN names its flag without its password.
func TestAPIShowsNoPasswordInARefusal(t *testing.T) {
	hide := []string{"S3cretPw"}
	testkit.CheckRefuses(t, apiBin, []testkit.BadFlag{
		{Args: []string{"-redis-url", "redis://:S3cretPw@127.0.0.1:63x79/0"}, Want: "-redis-url: ", Hide: hide},
		{Env: "STEPCOLLECT_REDIS_URL=redis-sentinel://:S3cretPw@127.0.0.1:26379", Want: "-redis-url: ", Hide: hide},
		{Args: []string{"-mysql-dsn", "stepcollect:S3cretPw@tcp(db:3306)/stepcollect?parseTime=maybe"}, Want: "-mysql-dsn: ", Hide: hide},
	})
}

// -h prints the flags with their defaults, which come from the
// environment: no key, HMAC key or password may show.
func TestAPIHelpShowsNoSecretFromTheEnvironment(t *testing.T) {
	cmd := exec.Command(apiBin, "-h")
	cmd.Env = append(os.Environ(), "STEPCOLLECT_API_KEY=api-s3cret", "STEPCOLLECT_WEBHOOK_HMAC_KEY=hmac-s3cret",
		"STEPCOLLECT_MYSQL_DSN=stepcollect:dsn-s3cret@tcp(db:3306)/stepcollect", "STEPCOLLECT_REDIS_URL=redis://:redis-s3cret@redis:6379/0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("-h: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "s3cret") {
		t.Errorf("-h shows a secret:\n%s", out)
	}
	for _, want := range []string{"-api-key", "(env STEPCOLLECT_API_KEY) (set)", "stepcollect:xxxxx@tcp(db:3306)/stepcollect",
		"-max-inflight-body-bytes", "-max-step-ids", "-max-step-commands", "-max-step-rows"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-h lacks %q:\n%s", want, out)
		}
	}
}

func TestAPIRefusesBadLimitFlagsInOneLineNamingThem(t *testing.T) {
	testkit.CheckRefuses(t, apiBin, []testkit.BadFlag{
		{Args: []string{"-max-inflight-body-bytes", "1048576"}, Want: "-max-inflight-body-bytes: 1048576 is less than -max-body-bytes (33554432)"},
		{Args: []string{"-max-body-bytes", "4096", "-max-inflight-body-bytes", "4095"}, Want: "-max-inflight-body-bytes: 4095 is less than -max-body-bytes (4096)"},
		{Args: []string{"-max-step-rows", "0"}, Want: "-max-step-rows: 0 is less than 1"},
		{Args: []string{"-max-step-commands", "-1"}, Want: "-max-step-commands: -1 is less than 1"},
		{Args: []string{"-mysql-max-active-results", "0"}, Want: "-mysql-max-active-results: 0 is less than 1"},
		{Env: "STEPCOLLECT_MAX_STEP_IDS=lots", Want: `-max-step-ids: STEPCOLLECT_MAX_STEP_IDS="lots" is not a whole number`},
	})
}
