// Package config reads the binaries' flags, each with an environment
// fallback: the environment sets the default, a flag on the command line
// wins. A bad value stops the binary with one line naming the flag.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/stepcollect/stepcollect/internal/version"
)

// Defaults every binary shares (docs/reference.md, "The binaries").
const (
	DefaultMySQLDSN = "root@tcp(127.0.0.1:3306)/stepcollect?parseTime=true"
	DefaultRedisURL = "redis://127.0.0.1:6379/0"
)

// Set is a flag set with environment fallbacks.
type Set struct {
	fs      *flag.FlagSet
	getenv  func(string) string
	envErrs []envError // environment values that could not be read
	checks  []func() error
	secrets []secretFlag
	redact  map[string]func(string) string // flag name: how Usage shows its default
	version *bool                          // -version, which every binary takes
}

// envError is an environment value its flag's type cannot read. It stops
// the binary only when the flag is not given: a flag on the command line
// wins, and the value it overrides is never used.
type envError struct {
	flag string
	err  error
}

type secretFlag struct {
	name, usage string
	value       *string
}

// New returns a Set for the binary name, reading the environment through
// getenv (os.Getenv in the binaries, a map in tests).
func New(name string, getenv func(string) string) *Set {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	s := &Set{fs: fs, getenv: getenv}
	s.version = s.Switch("version", "print the version, commit, build time and Go version, and exit")
	return s
}

// Switch defines a boolean flag with no environment fallback: an action
// for one run of the binary (-version, -probe), which an environment
// variable left set would turn into every run's.
func (s *Set) Switch(name, usage string) *bool {
	return s.fs.Bool(name, false, usage)
}

// Lookup returns the value of the flag name after Parse, as its String
// method gives it, and whether the Set defines it.
func (s *Set) Lookup(name string) (string, bool) {
	f := s.fs.Lookup(name)
	if f == nil {
		return "", false
	}
	return f.Value.String(), true
}

func (s *Set) usage(name, env, usage string) string {
	return fmt.Sprintf("%s (env %s)", usage, env)
}

// String defines a string flag.
func (s *Set) String(name, env, def, usage string) *string {
	if v := s.getenv(env); v != "" {
		def = v
	}
	return s.fs.String(name, def, s.usage(name, env, usage))
}

// Secret defines a string flag whose value never shows: Usage says "(set)"
// when it has one, nothing otherwise. For keys and passwords, which would
// otherwise appear in -h output as the default taken from the environment.
func (s *Set) Secret(name, env, usage string) *string {
	p := new(string)
	*p = s.getenv(env)
	full := s.usage(name, env, usage)
	s.fs.Var((*secretValue)(p), name, full)
	s.secrets = append(s.secrets, secretFlag{name: name, usage: full, value: p})
	return p
}

// secretValue is a string whose String is empty, so that the flag package
// never prints it as a default.
type secretValue string

func (v *secretValue) Set(x string) error { *v = secretValue(x); return nil }
func (v *secretValue) String() string     { return "" }

// DSN defines a go-sql-driver DSN flag. The value is used as given; Usage
// shows its default with the password replaced by xxxxx.
func (s *Set) DSN(name, env, def, usage string) *string {
	p := s.String(name, env, def, usage)
	s.redactDefault(name, RedactDSN)
	return p
}

// URL defines a URL flag whose default Usage shows with the password
// replaced by xxxxx (redis://:pw@host keeps one there).
func (s *Set) URL(name, env, def, usage string) *string {
	p := s.String(name, env, def, usage)
	s.redactDefault(name, RedactURL)
	return p
}

func (s *Set) redactDefault(name string, f func(string) string) {
	if s.redact == nil {
		s.redact = map[string]func(string) string{}
	}
	s.redact[name] = f
}

// RedactDSN replaces the password of a go-sql-driver DSN
// ([user[:password]@][net[(addr)]]/dbname[?params]) by xxxxx. It finds the
// password as the driver does (the last @ before the last /, the first :
// before that) rather than re-formatting the DSN, so that what is shown is
// otherwise exactly what was given, parsable or not.
func RedactDSN(dsn string) string {
	start, end := dsnPassword(dsn)
	if start < 0 {
		return dsn
	}
	return dsn[:start] + mask + dsn[end:]
}

// dsnPassword is where the password of dsn starts and ends (-1: none).
func dsnPassword(dsn string) (start, end int) {
	end = strings.LastIndex(dsn, "/")
	if end < 0 {
		end = len(dsn)
	}
	at := strings.LastIndex(dsn[:end], "@")
	if at < 0 {
		return -1, -1
	}
	colon := strings.Index(dsn[:at], ":")
	if colon < 0 {
		return -1, -1
	}
	return colon + 1, at
}

// Bool defines a boolean flag.
func (s *Set) Bool(name, env string, def bool, usage string) *bool {
	if v := s.getenv(env); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			s.envErrs = append(s.envErrs, envError{name, fmt.Errorf("-%s: %s=%q is not true or false", name, env, v)})
		} else {
			def = b
		}
	}
	return s.fs.Bool(name, def, s.usage(name, env, usage))
}

// Int defines an integer flag.
func (s *Set) Int(name, env string, def int, usage string) *int {
	if v := s.getenv(env); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			s.envErrs = append(s.envErrs, envError{name, fmt.Errorf("-%s: %s=%q is not a whole number", name, env, v)})
		} else {
			def = n
		}
	}
	return s.fs.Int(name, def, s.usage(name, env, usage))
}

// Duration defines a duration flag ("30s", "2m"; "0" where zero means off).
func (s *Set) Duration(name, env string, def time.Duration, usage string) *time.Duration {
	if v := s.getenv(env); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			s.envErrs = append(s.envErrs, envError{name, fmt.Errorf("-%s: %s=%q is not a duration (like 30s or 2m)", name, env, v)})
		} else {
			def = d
		}
	}
	p := s.fs.Duration(name, def, s.usage(name, env, usage))
	s.Check(func() error {
		if *p < 0 {
			return fmt.Errorf("-%s: %v is negative", name, *p)
		}
		return nil
	})
	return p
}

// Check adds a validation run after parsing.
func (s *Set) Check(f func() error) { s.checks = append(s.checks, f) }

// Parse parses args and runs the checks. It returns the first problem, in
// one line naming the flag; flag.ErrHelp for -h. For -version it returns
// an error for which both IsVersion and IsHelp are true, before looking at
// any other value: a caller that only knows -h calls Usage, which then
// writes the version line.
func (s *Set) Parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		return err
	}
	if *s.version {
		return errVersion
	}
	if s.fs.NArg() > 0 {
		// "-migrate false" sets -migrate and leaves "false" over: say so
		if i := len(args) - s.fs.NArg() - 1; i >= 0 {
			name := strings.TrimLeft(args[i], "-")
			if f := s.fs.Lookup(name); f != nil && !strings.Contains(args[i], "=") {
				if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
					return fmt.Errorf("unexpected argument %q after -%s, a switch: give its value as -%s=true or -%s=false", s.fs.Arg(0), name, name, name)
				}
			}
		}
		return fmt.Errorf("unexpected argument %q", s.fs.Arg(0))
	}
	given := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, e := range s.envErrs {
		if !given[e.flag] {
			return e.err
		}
	}
	for _, c := range s.checks {
		if err := c(); err != nil {
			return err
		}
	}
	return nil
}

// Usage writes the flags and their defaults to w. No secret shows: a
// Secret flag says only whether it is set, a DSN or URL default has its
// password replaced.
//
// After -version it writes the version line instead.
func (s *Set) Usage(w io.Writer) {
	if *s.version {
		fmt.Fprintln(w, version.Line(s.fs.Name()))
		return
	}
	for _, sf := range s.secrets {
		f := s.fs.Lookup(sf.name)
		f.Usage = sf.usage
		if *sf.value != "" {
			f.Usage += " (set)"
		}
	}
	for name, redact := range s.redact {
		f := s.fs.Lookup(name)
		f.DefValue = redact(f.DefValue)
	}
	s.fs.SetOutput(w)
	fmt.Fprintf(w, "Usage of %s:\n", s.fs.Name())
	s.fs.PrintDefaults()
	s.fs.SetOutput(io.Discard)
}

// IsHelp reports whether err is the -h/-help request (or -version: see
// Parse).
func IsHelp(err error) bool { return errors.Is(err, flag.ErrHelp) }

// IsVersion reports whether err is the -version request.
func IsVersion(err error) bool { return errors.Is(err, errVersion) }

// errVersion is Parse's answer to -version. It wraps flag.ErrHelp so that
// a binary that handles only -h (IsHelp, then Usage) prints the version.
var errVersion = versionRequest{}

type versionRequest struct{}

func (versionRequest) Error() string { return "-version: the version was asked for" }
func (versionRequest) Unwrap() error { return flag.ErrHelp }

// MySQLDSN checks a go-sql-driver DSN.
func MySQLDSN(flagName string, dsn *string) func() error {
	return func() error {
		cfg, err := mysql.ParseDSN(*dsn)
		if err != nil {
			return fmt.Errorf("-%s: %s", flagName, Redact(err.Error(), *dsn))
		}
		if cfg.DBName == "" {
			return fmt.Errorf("-%s: names no database (…/dbname?…)", flagName)
		}
		return nil
	}
}

// RedisURL checks a redis://, rediss:// or redis-sentinel:// URL. parse is
// the queue's own reading of it (asynq.ParseRedisURI's); it is passed in so
// that what imports this package for its redaction (delivery) does not
// link the queue.
func RedisURL(flagName string, u *string, parse func(string) error) func() error {
	return func() error {
		if err := parse(*u); err != nil {
			return fmt.Errorf("-%s: %s", flagName, Redact(err.Error(), *u))
		}
		// asynq accepts a Sentinel URL without the master's name, and
		// then fails every command at run time with a misleading error
		if p, err := url.Parse(*u); err == nil && p.Scheme == "redis-sentinel" && p.Query().Get("master") == "" {
			return fmt.Errorf("-%s: a redis-sentinel:// URL needs ?master=<name> (the name Sentinel monitors)", flagName)
		}
		return nil
	}
}

// ListenAddr checks a host:port to listen on.
func ListenAddr(flagName string, addr *string) func() error {
	return func() error {
		_, port, err := net.SplitHostPort(*addr)
		if err != nil {
			return fmt.Errorf("-%s: %v", flagName, err)
		}
		// a port the listener cannot have is this line at start, not an
		// error from net.Listen after the logger has started
		if n, err := strconv.Atoi(port); err == nil {
			if n < 0 || n > 65535 {
				return fmt.Errorf("-%s: port %d of %q is not between 0 and 65535", flagName, n, *addr)
			}
		} else if _, err := net.LookupPort("tcp", port); err != nil {
			return fmt.Errorf("-%s: port %q of %q is not a number or a known service", flagName, port, *addr)
		}
		return nil
	}
}

// HTTPURL checks an optional http(s) URL.
func HTTPURL(flagName string, u *string) func() error {
	return func() error {
		if *u == "" {
			return nil
		}
		p, err := url.Parse(*u)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return fmt.Errorf("-%s: %q is not an http(s) URL", flagName, RedactURL(*u))
		}
		return nil
	}
}
