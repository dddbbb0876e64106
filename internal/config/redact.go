package config

import (
	"net/url"
	"strconv"
	"strings"
)

// mask is what a secret shows as.
const mask = "xxxxx"

// RedactURL replaces the user information of a URL by xxxxx: the password,
// and the user name too (a callback's basic-auth user may be a token), so
// redis://:pw@host shows as redis://:xxxxx@host and https://u:p@host as
// https://xxxxx:xxxxx@host. It works on the text, as url.Parse splits the
// authority (the last @ before the first /, ? or #), so that a value that
// does not parse is shown redacted rather than not at all.
func RedactURL(u string) string {
	ui, start, end := userinfo(u)
	if start < 0 {
		return u
	}
	user, _, hasPW := strings.Cut(ui, ":")
	red := maskNonEmpty(user)
	if hasPW {
		red += ":" + mask
	}
	return u[:start] + red + u[end:]
}

// userinfo finds the user information of u: its text and where it starts
// and ends (start -1: none).
func userinfo(u string) (ui string, start, end int) {
	scheme := strings.Index(u, "://")
	if scheme < 0 {
		return "", -1, -1
	}
	start = scheme + 3
	auth := u[start:]
	if i := strings.IndexAny(auth, "/?#"); i >= 0 {
		auth = auth[:i]
	}
	at := strings.LastIndex(auth, "@")
	if at < 0 {
		return "", -1, -1
	}
	return auth[:at], start, start + at
}

func maskNonEmpty(s string) string {
	if s == "" {
		return ""
	}
	return mask
}

// secrets are the parts of a URL or DSN that must never be printed: the
// URL's user and password, the DSN's password, each also percent-decoded
// and as %q quotes it.
func secrets(value string) []string {
	var raw []string
	if isURL(value) {
		if ui, start, _ := userinfo(value); start >= 0 {
			user, pw, _ := strings.Cut(ui, ":")
			raw = append(raw, user, pw)
		}
	} else if start, end := dsnPassword(value); start >= 0 {
		raw = append(raw, value[start:end])
	}
	var all []string
	for _, s := range raw {
		if s == "" {
			continue
		}
		all = append(all, s)
		if d, err := url.PathUnescape(s); err == nil && d != s {
			all = append(all, d)
		}
		if q := strconv.Quote(s); q[1:len(q)-1] != s {
			all = append(all, q[1:len(q)-1])
		}
	}
	return all
}

func isURL(value string) bool { return strings.Contains(value, "://") }

// Redact returns msg with every secret of values (URLs and DSNs that msg
// may quote, whole or in part, as url.Parse's and the drivers' errors do)
// replaced by xxxxx; the rest of each value stays readable.
func Redact(msg string, values ...string) string {
	for _, v := range values {
		if v == "" {
			continue
		}
		if isURL(v) {
			msg = strings.ReplaceAll(msg, v, RedactURL(v))
		} else {
			msg = strings.ReplaceAll(msg, v, RedactDSN(v))
		}
		for _, s := range secrets(v) {
			msg = strings.ReplaceAll(msg, s, mask)
		}
	}
	return msg
}

// RedactError is err with Redact applied to its message; errors.Is and
// errors.As still see err.
func RedactError(err error, values ...string) error {
	if err == nil {
		return nil
	}
	msg := Redact(err.Error(), values...)
	if msg == err.Error() {
		return err
	}
	return &redactedError{msg: msg, err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
