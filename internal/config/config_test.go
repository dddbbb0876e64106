package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stepcollect/stepcollect/internal/config"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestTheEnvironmentSetsDefaultsAndAFlagWins(t *testing.T) {
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

func TestBadValuesAreOneLineNamingTheFlag(t *testing.T) {
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
		{nil, []string{"-url", "ftp://x"}, `-url: "ftp://x" is not an http(s) URL`},
		{nil, []string{"-listen", "nowhere"}, "-listen: "},
		{nil, []string{"stray"}, `unexpected argument "stray"`},
	} {
		s := config.New("t", env(tc.env))
		s.Duration("wait", "T_WAIT", time.Second, "")
		s.Bool("on", "T_ON", true, "")
		dsn := s.String("dsn", "T_DSN", "root@tcp(127.0.0.1:3306)/db", "")
		redis := s.String("redis", "T_REDIS", "redis://127.0.0.1:6379/0", "")
		url := s.String("url", "T_URL", "", "")
		listen := s.String("listen", "T_LISTEN", "127.0.0.1:1", "")
		s.Check(config.MySQLDSN("dsn", dsn))
		s.Check(config.RedisURL("redis", redis))
		s.Check(config.HTTPURL("url", url))
		s.Check(config.ListenAddr("listen", listen))
		err := s.Parse(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("env %v args %v: %v, want one line containing %q", tc.env, tc.args, err, tc.want)
		}
	}
}

func TestADSNWithoutADatabaseIsRefused(t *testing.T) {
	s := config.New("t", env(nil))
	dsn := s.String("dsn", "T_DSN", "root@tcp(127.0.0.1:3306)/", "")
	s.Check(config.MySQLDSN("dsn", dsn))
	if err := s.Parse(nil); err == nil || !strings.Contains(err.Error(), "names no database") {
		t.Errorf("%v", err)
	}
}
