package mysql

import (
	"context"
	"strings"
	"sync"
	"unicode/utf8"
)

// An id, command UUID or name with a character its column cannot hold (an
// emoji, in a database NanoCMD made in utf8mb3) matches no row; but MariaDB
// answers a comparison with it error 1267, "illegal mix of collations",
// which was a 5xx for a client's value. The storage reads the character set
// of the engine's columns once and answers such a value as matching
// nothing, without sending it.

// idCharset is the character set of the engine's id columns, once read.
type idCharset struct {
	mu   sync.Mutex
	name string // "" until read
}

// holds reports whether the engine's columns can hold every one of values.
// ASCII, which every character set holds, asks nothing of the database.
func (s *Storage) holds(ctx context.Context, values ...string) bool {
	if !slicesAnyNonASCII(values) {
		return true
	}
	fits := charsetFits(s.idCharset(ctx))
	for _, v := range values {
		if !fits(v) {
			return false
		}
	}
	return true
}

// holdable is those of values the engine's columns can hold.
func (s *Storage) holdable(ctx context.Context, values []string) []string {
	if s.holds(ctx, values...) {
		return values
	}
	out := make([]string, 0, len(values))
	for _, v := range values {
		if s.holds(ctx, v) {
			out = append(out, v)
		}
	}
	return out
}

func slicesAnyNonASCII(values []string) bool {
	for _, v := range values {
		for i := 0; i < len(v); i++ {
			if v[i] >= utf8.RuneSelf {
				return true
			}
		}
	}
	return false
}

// idCharset reads id_commands.enrollment_id's character set once; "" (any
// value fits) when it cannot be read now.
func (s *Storage) idCharset(ctx context.Context) string {
	s.charset.mu.Lock()
	defer s.charset.mu.Unlock()
	if s.charset.name == "" {
		var name string
		if err := s.db.QueryRowContext(ctx, qIDCharset).Scan(&name); err == nil {
			s.charset.name = name
		}
	}
	return s.charset.name
}

// charsetFits says whether a string's characters all have a place in the
// character set name (MySQL's latin1 is cp1252).
func charsetFits(name string) func(string) bool {
	switch {
	case strings.HasPrefix(name, "utf8mb3"), name == "utf8", name == "ucs2":
		return func(s string) bool { return !strings.ContainsFunc(s, func(r rune) bool { return r > 0xFFFF }) }
	case name == "latin1":
		return func(s string) bool {
			return !strings.ContainsFunc(s, func(r rune) bool { return r > 0xFF && !strings.ContainsRune(cp1252, r) })
		}
	case name == "ascii":
		return func(s string) bool { return !strings.ContainsFunc(s, func(r rune) bool { return r >= utf8.RuneSelf }) }
	}
	return func(string) bool { return true }
}

// cp1252 is what latin1 holds beyond U+00FF.
const cp1252 = "€‚ƒ„…†‡ˆ‰Š‹ŒŽ‘’“”•–—˜™š›œžŸ"
