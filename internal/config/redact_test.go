package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/stepcollect/stepcollect/internal/config"
)

// A refused URL or DSN is named by its flag, with its user information
// (or the DSN's password) replaced by xxxxx: the refusal goes to logs.
func TestRefusalsNameTheFlagButShowNoPassword(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		flag, value string
		secrets     []string
	}{
		{"redis-url", "redis://:S3cretPw@127.0.0.1:63x79/0", []string{"S3cretPw"}},
		{"redis-url", "redis://admin:S3cretPw@127.0.0.1:6379/db", []string{"S3cretPw"}},
		{"redis-url", "http://admin:S3cretPw@127.0.0.1:6379/0", []string{"S3cretPw"}},
		{"redis-url", "redis-sentinel://:S3cretPw@127.0.0.1:26379", []string{"S3cretPw"}},
		{"callback-url", "ftp://cbuser:S3cretPw@engine.example/cb", []string{"S3cretPw", "cbuser"}},
		{"callback-url", "http://cbuser:S3cretPw@", []string{"S3cretPw", "cbuser"}},
		{"callback-url", "https://cbuser:S3cret%22Pw@engine.example:x/cb", []string{"S3cret%22Pw", `S3cret"Pw`, "cbuser"}},
		{"mysql-dsn", "stepcollect:S3cretPw@tcp(db:3306)/stepcollect?parseTime=maybe", []string{"S3cretPw"}},
	} {
		s := config.New("t", func(string) string { return "" })
		dsn := s.DSN("mysql-dsn", "T_DSN", "root@tcp(127.0.0.1:3306)/db", "")
		redis := s.URL("redis-url", "T_REDIS", "redis://127.0.0.1:6379/0", "")
		callback := s.URL("callback-url", "T_CALLBACK", "", "")
		s.Check(config.MySQLDSN("mysql-dsn", dsn))
		s.Check(config.RedisURL("redis-url", redis, parseRedisURL))
		s.Check(config.HTTPURL("callback-url", callback))
		err := s.Parse([]string{"-" + tc.flag, tc.value})
		if err == nil {
			t.Errorf("-%s %s: accepted, want it refused", tc.flag, tc.value)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "-"+tc.flag+": ") || strings.Contains(msg, "\n") {
			t.Errorf("-%s %s: %q, want one line naming the flag", tc.flag, tc.value, msg)
		}
		for _, secret := range tc.secrets {
			if strings.Contains(msg, secret) {
				t.Errorf("-%s: %q shows %q", tc.flag, msg, secret)
			}
		}
	}
}

func TestRedactURLReplacesTheUserInformation(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"redis://:pw@redis:6379/0":               "redis://:xxxxx@redis:6379/0",
		"redis://default:pw@redis:6379/0":        "redis://xxxxx:xxxxx@redis:6379/0",
		"https://u:p@engine.example/cb?a=b@c":    "https://xxxxx:xxxxx@engine.example/cb?a=b@c",
		"https://token@engine.example/cb":        "https://xxxxx@engine.example/cb",
		"https://engine.example/cb":              "https://engine.example/cb",
		"redis://:p@ss@127.0.0.1:63x79/0":        "redis://:xxxxx@127.0.0.1:63x79/0", // unparsable, redacted all the same
		"redis-sentinel://:pw@s1:26379,s2:26379": "redis-sentinel://:xxxxx@s1:26379,s2:26379",
		"":                                       "",
		"not a url":                              "not a url",
	} {
		if got := config.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// RedactError keeps the error's identity and removes every form of the
// secret an error may quote it in.
func TestRedactErrorRemovesQuotedAndDecodedSecrets(t *testing.T) {
	t.Parallel()
	u := "http://cb%40user:p%2Fss@engine.example/cb"
	base := errors.New(`Post "http://cb@user:***@engine.example/cb": user cb@user, password "p/ss" or p%2Fss`)
	err := config.RedactError(base, u)
	if !errors.Is(err, base) {
		t.Error("the redacted error does not wrap the original")
	}
	for _, secret := range []string{"cb@user", "cb%40user", "p/ss", "p%2Fss"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%q shows %q", err, secret)
		}
	}
	if !strings.Contains(err.Error(), "engine.example/cb") {
		t.Errorf("%q lost the host", err)
	}
}
