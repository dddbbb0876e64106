package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/stepcollect/stepcollect/internal/config"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestTheEnvironmentSetsDefaultsAndAFlagWins(t *testing.T) {
	t.Parallel()
	s := config.New("t", env(map[string]string{"T_NAME": "from-env", "T_WAIT": "5s", "T_ON": "false", "T_N": "7"}))
	name := s.String("name", "T_NAME", "default", "")
	wait := s.Duration("wait", "T_WAIT", time.Second, "")
	on := s.Bool("on", "T_ON", true, "")
	n := s.Int("n", "T_N", 1, "")
	if err := s.Parse([]string{"-wait", "9s"}); err != nil {
		t.Fatal(err)
	}
	if *name != "from-env" || *wait != 9*time.Second || *on || *n != 7 {
		t.Errorf("name %q wait %v on %v n %d", *name, *wait, *on, *n)
	}
}

// An environment value its flag cannot read stops nothing when the flag
// is given: the flag wins, and the value is never used.
func TestAFlagWinsOverAnUnreadableEnvironmentValue(t *testing.T) {
	t.Parallel()
	s := config.New("t", env(map[string]string{"T_WAIT": "30", "T_ON": "maybe", "T_N": "abc"}))
	wait := s.Duration("wait", "T_WAIT", time.Second, "")
	on := s.Bool("on", "T_ON", false, "")
	n := s.Int("n", "T_N", 1, "")
	if err := s.Parse([]string{"-wait", "5s", "-on=true", "-n", "4"}); err != nil {
		t.Fatalf("every flag given: %v", err)
	}
	if *wait != 5*time.Second || !*on || *n != 4 {
		t.Errorf("wait %v on %v n %d, want the flags' 5s true 4", *wait, *on, *n)
	}
	s = config.New("t", env(map[string]string{"T_WAIT": "30", "T_N": "abc"}))
	s.Duration("wait", "T_WAIT", time.Second, "")
	s.Int("n", "T_N", 1, "")
	if err := s.Parse([]string{"-wait", "5s"}); err == nil || !strings.Contains(err.Error(), `-n: T_N="abc" is not a whole number`) {
		t.Errorf("-n not given: %v, want T_N named", err)
	}
}

func TestBadValuesAreOneLineNamingTheFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"T_WAIT": "soon"}, nil, `-wait: T_WAIT="soon" is not a duration`},
		{nil, []string{"-wait", "-3s"}, "-wait: -3s is negative"},
		{map[string]string{"T_ON": "maybe"}, nil, `-on: T_ON="maybe" is not true or false`},
		{nil, []string{"-dsn", "nope"}, "-dsn: "},
		{nil, []string{"-redis", "http://x"}, "-redis: "},
		{nil, []string{"-redis", "redis-sentinel://127.0.0.1:26379"}, "-redis: a redis-sentinel:// URL needs ?master=<name>"},
		{nil, []string{"-url", "ftp://x"}, `-url: "ftp://x" is not an http(s) URL`},
		{nil, []string{"-listen", "nowhere"}, "-listen: "},
		{nil, []string{"-listen", "127.0.0.1:99999"}, `-listen: port 99999 of "127.0.0.1:99999" is not between 0 and 65535`},
		{nil, []string{"-listen", "127.0.0.1:nosuchservice"}, `-listen: port "nosuchservice" of "127.0.0.1:nosuchservice" is not a number or a known service`},
		{nil, []string{"stray"}, `unexpected argument "stray"`},
		{nil, []string{"-on", "false"}, `unexpected argument "false" after -on, a switch: give its value as -on=true or -on=false`},
	} {
		s := config.New("t", env(tc.env))
		s.Duration("wait", "T_WAIT", time.Second, "")
		s.Bool("on", "T_ON", true, "")
		dsn := s.String("dsn", "T_DSN", "root@tcp(127.0.0.1:3306)/db", "")
		redis := s.String("redis", "T_REDIS", "redis://127.0.0.1:6379/0", "")
		url := s.String("url", "T_URL", "", "")
		listen := s.String("listen", "T_LISTEN", "127.0.0.1:1", "")
		s.Check(config.MySQLDSN("dsn", dsn))
		s.Check(config.RedisURL("redis", redis, parseRedisURL))
		s.Check(config.HTTPURL("url", url))
		s.Check(config.ListenAddr("listen", listen))
		err := s.Parse(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("env %v args %v: %v, want one line containing %q", tc.env, tc.args, err, tc.want)
		}
	}
}

func TestADSNWithoutADatabaseIsRefused(t *testing.T) {
	t.Parallel()
	s := config.New("t", env(nil))
	dsn := s.String("dsn", "T_DSN", "root@tcp(127.0.0.1:3306)/", "")
	s.Check(config.MySQLDSN("dsn", dsn))
	if err := s.Parse(nil); err == nil || !strings.Contains(err.Error(), "names no database") {
		t.Errorf("%v", err)
	}
}

func TestSecretsTakeTheEnvironmentAndAFlagWins(t *testing.T) {
	t.Parallel()
	s := config.New("t", env(map[string]string{"T_KEY": "env-key", "T_OTHER": "env-other"}))
	key := s.Secret("key", "T_KEY", "a key")
	other := s.Secret("other", "T_OTHER", "another key")
	none := s.Secret("none", "T_NONE", "no key")
	if err := s.Parse([]string{"-other", "flag-other"}); err != nil {
		t.Fatal(err)
	}
	if *key != "env-key" || *other != "flag-other" || *none != "" {
		t.Errorf("key %q other %q none %q", *key, *other, *none)
	}
}

func TestHelpShowsNoSecretFromTheEnvironment(t *testing.T) {
	t.Parallel()
	secrets := map[string]string{
		"STEPCOLLECT_API_KEY":           "api-key-s3cret",
		"STEPCOLLECT_WEBHOOK_HMAC_KEY":  "webhook-hmac-s3cret",
		"STEPCOLLECT_CALLBACK_HMAC_KEY": "callback-hmac-s3cret",
		"STEPCOLLECT_MYSQL_DSN":         "stepcollect:dsn-pa55word@tcp(db:3306)/stepcollect?parseTime=true",
		"STEPCOLLECT_REDIS_URL":         "redis://:redis-pa55word@redis:6379/0",
	}
	s := config.New("t", env(secrets))
	s.Secret("api-key", "STEPCOLLECT_API_KEY", "API key")
	s.Secret("webhook-hmac-key", "STEPCOLLECT_WEBHOOK_HMAC_KEY", "webhook key")
	s.Secret("callback-hmac-key", "STEPCOLLECT_CALLBACK_HMAC_KEY", "callback key")
	s.Secret("unset-key", "STEPCOLLECT_UNSET_KEY", "a key nobody set")
	dsn := s.DSN("mysql-dsn", "STEPCOLLECT_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/stepcollect", "DSN")
	redis := s.URL("redis-url", "STEPCOLLECT_REDIS_URL", "redis://127.0.0.1:6379/0", "Redis URL")
	err := s.Parse([]string{"-h"})
	if !config.IsHelp(err) {
		t.Fatalf("-h: %v", err)
	}
	var out strings.Builder
	s.Usage(&out)
	help := out.String()
	for _, secret := range []string{"api-key-s3cret", "webhook-hmac-s3cret", "callback-hmac-s3cret", "dsn-pa55word", "redis-pa55word", "s3cret", "pa55word"} {
		if strings.Contains(help, secret) {
			t.Errorf("help shows %q:\n%s", secret, help)
		}
	}
	for _, want := range []string{
		"API key (env STEPCOLLECT_API_KEY) (set)",
		"callback key (env STEPCOLLECT_CALLBACK_HMAC_KEY) (set)",
		`stepcollect:xxxxx@tcp(db:3306)/stepcollect?parseTime=true`,
		`redis://:xxxxx@redis:6379/0`,
	} {
		if !strings.Contains(help, want) {
			t.Errorf("help lacks %q:\n%s", want, help)
		}
	}
	if strings.Contains(help, "a key nobody set (env STEPCOLLECT_UNSET_KEY) (set)") {
		t.Errorf("an unset secret shows as set:\n%s", help)
	}
	// The values themselves are used as given.
	if *dsn != secrets["STEPCOLLECT_MYSQL_DSN"] || *redis != secrets["STEPCOLLECT_REDIS_URL"] {
		t.Errorf("dsn %q redis %q: the real values must be kept", *dsn, *redis)
	}
}

func TestRedactDSNReplacesOnlyThePassword(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"root@tcp(127.0.0.1:3306)/db?parseTime=true":    "root@tcp(127.0.0.1:3306)/db?parseTime=true",
		"u:p@tcp(h:3306)/db":                            "u:xxxxx@tcp(h:3306)/db",
		"u:p@ss:w@rd@unix(/var/run/mysqld.sock)/db?x=y": "u:xxxxx@unix(/var/run/mysqld.sock)/db?x=y",
		"u:@tcp(h)/db":                                  "u:xxxxx@tcp(h)/db",
		"/db":                                           "/db",
		"u:secret@tcp(h)":                               "u:xxxxx@tcp(h)",
		"":                                              "",
		"u:with/slash@tcp(h)/db":                        "u:xxxxx@tcp(h)/db", // the driver reads the password "with/slash"
		"u:p@tcp(h:3306)/db?loc=Local&tls=skip-verify&a=b": "u:xxxxx@tcp(h:3306)/db?loc=Local&tls=skip-verify&a=b",
		"stepcollect:pw@tcp([::1]:3306)/stepcollect?a=b@c": "stepcollect:xxxxx@tcp([::1]:3306)/stepcollect?a=b@c",
	} {
		if got := config.RedactDSN(in); got != want {
			t.Errorf("RedactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}

// parseRedisURL is the binaries' parse of -redis-url (app's).
func parseRedisURL(u string) error { _, err := asynq.ParseRedisURI(u); return err }
