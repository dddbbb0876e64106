package mdmplist

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"unicode/utf8"
)

// fastTokens reads the XML that plist writers produce (Apple's,
// micromdm/plist's, Python's plistlib) straight from the bytes, into the
// tokens encoding/xml's RawToken gives, for the same xmlScanner to check:
// RawToken reads a byte at a time through an interface call. Anything
// outside that subset (CDATA, processing instructions, character
// references, carriage returns, unusual attributes or names) and every
// error sends the whole document to encoding/xml, so the fast path accepts
// only what encoding/xml accepts, with the same strings
// (FuzzFastTokensAgreeWithEncodingXML), and every refusal is its.

// errNotFast: the document leaves fastTokens' subset; read it with
// encoding/xml.
var errNotFast = errors.New("mdmplist: not in the fast subset")

type fastTokens struct {
	b     []byte
	i     int
	text  []byte // text's buffer, reused (a token is valid until the next)
	pend  bool   // an EndElement for name is due (a self-closing element)
	name  string
	names map[string]string // element names, interned
}

func newFastTokens(b []byte) *fastTokens {
	return &fastTokens{b: b, names: map[string]string{}}
}

func (f *fastTokens) InputOffset() int64 { return int64(f.i) }

func (f *fastTokens) next() (token, error) {
	if f.pend {
		f.pend = false
		return token{kind: tokEnd, name: xml.Name{Local: f.name}}, nil
	}
	if f.i >= len(f.b) {
		return token{}, io.EOF
	}
	if f.b[f.i] != '<' {
		return f.charData()
	}
	rest := f.b[f.i:]
	switch {
	case bytes.HasPrefix(rest, []byte("<!--")):
		return f.comment()
	case bytes.HasPrefix(rest, []byte("<!DOCTYPE")):
		return f.doctype()
	case bytes.HasPrefix(rest, []byte("<?xml ")):
		return f.xmlDecl()
	case bytes.HasPrefix(rest, []byte("</")):
		f.i += 2
		name, ok := f.elementName()
		if !ok {
			return token{}, errNotFast
		}
		f.space()
		if !f.take('>') {
			return token{}, errNotFast
		}
		return token{kind: tokEnd, name: xml.Name{Local: name}}, nil
	}
	f.i++
	name, ok := f.elementName()
	if !ok {
		return token{}, errNotFast
	}
	// Attributes are read and dropped, as xmlScanner does with
	// encoding/xml's.
	for {
		spaced := f.space()
		switch {
		case f.take('>'):
			return token{kind: tokStart, name: xml.Name{Local: name}}, nil
		case f.take('/'):
			if !f.take('>') {
				return token{}, errNotFast
			}
			f.pend, f.name = true, name
			return token{kind: tokStart, name: xml.Name{Local: name}}, nil
		case !spaced:
			return token{}, errNotFast
		}
		if !f.attr() {
			return token{}, errNotFast
		}
	}
}

// charData reads text up to the next '<': ASCII, or UTF-8 that is valid
// and in XML's character range, with the five predefined entities.
func (f *fastTokens) charData() (token, error) {
	f.text = f.text[:0]
	start, decoded := f.i, false
	for f.i < len(f.b) && f.b[f.i] != '<' {
		c := f.b[f.i]
		switch {
		case c == '&':
			f.text = append(f.text, f.b[start:f.i]...)
			r, n := predefinedEntity(f.b[f.i:])
			if n == 0 {
				return token{}, errNotFast
			}
			f.text = append(f.text, r)
			f.i += n
			start, decoded = f.i, true
		case c == '\r' || c == '>' && bytes.HasSuffix(f.b[start:f.i], []byte("]]")):
			return token{}, errNotFast // line ends normalised, "]]>": encoding/xml's
		case c >= 0x20 && c < utf8.RuneSelf || c == '\n' || c == '\t':
			f.i++
		case c < utf8.RuneSelf:
			return token{}, errNotFast // a control character
		default:
			r, n := utf8.DecodeRune(f.b[f.i:])
			if r == utf8.RuneError || !xmlChar(r) {
				return token{}, errNotFast
			}
			f.i += n
		}
	}
	if !decoded {
		return token{kind: tokText, data: f.b[start:f.i]}, nil // no entity: the input itself
	}
	f.text = append(f.text, f.b[start:f.i]...)
	return token{kind: tokText, data: f.text}, nil
}

func predefinedEntity(b []byte) (byte, int) {
	for _, e := range [...]struct {
		s string
		r byte
	}{{"&lt;", '<'}, {"&gt;", '>'}, {"&amp;", '&'}, {"&quot;", '"'}, {"&apos;", '\''}} {
		if bytes.HasPrefix(b, []byte(e.s)) {
			return e.r, len(e.s)
		}
	}
	return 0, 0
}

func xmlChar(r rune) bool {
	return r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF
}

// comment reads <!-- ... --> whose text is printable ASCII or white space
// and holds no "--".
func (f *fastTokens) comment() (token, error) {
	body := f.b[f.i+4:]
	end := bytes.Index(body, []byte("--"))
	if end < 0 || end+2 >= len(body) || body[end+2] != '>' || !plainASCII(body[:end]) || bytes.HasSuffix(body[:end], []byte("-")) {
		return token{}, errNotFast
	}
	f.i += 4 + end + 3
	return token{kind: tokComment}, nil
}

// doctype reads <!DOCTYPE ...> with no markup, brackets or comments in it.
func (f *fastTokens) doctype() (token, error) {
	body := f.b[f.i+2:]
	end := bytes.IndexByte(body, '>')
	if end < 0 || bytes.ContainsAny(body[:end], "<[]'") || !plainASCII(body[:end]) || bytes.Count(body[:end], []byte(`"`))%2 != 0 {
		return token{}, errNotFast
	}
	f.i += 2 + end + 1
	return token{kind: tokDirective, data: body[:end]}, nil
}

// xmlDecl reads the declarations plist writers write: version 1.0, and
// the encoding UTF-8 or none.
func (f *fastTokens) xmlDecl() (token, error) {
	for _, d := range [...]string{
		`<?xml version="1.0" encoding="UTF-8"?>`,
		`<?xml version="1.0" encoding="utf-8"?>`,
		`<?xml version="1.0"?>`,
	} {
		if bytes.HasPrefix(f.b[f.i:], []byte(d)) {
			f.i += len(d)
			return token{kind: tokProcInst, target: "xml"}, nil
		}
	}
	return token{}, errNotFast
}

// elementName reads a name of ASCII letters.
func (f *fastTokens) elementName() (string, bool) {
	start := f.i
	for f.i < len(f.b) && (f.b[f.i] >= 'a' && f.b[f.i] <= 'z' || f.b[f.i] >= 'A' && f.b[f.i] <= 'Z') {
		f.i++
	}
	if f.i == start {
		return "", false
	}
	raw := f.b[start:f.i]
	if n, ok := f.names[string(raw)]; ok {
		return n, true
	}
	n := string(raw)
	f.names[n] = n
	return n, true
}

// attr reads name="value": a name of ASCII letters, a value of letters,
// digits, '.', '-' and '_'.
func (f *fastTokens) attr() bool {
	if _, ok := f.elementName(); !ok || !f.take('=') || !f.take('"') {
		return false
	}
	start := f.i
	for f.i < len(f.b) {
		c := f.b[f.i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_' {
			f.i++
			continue
		}
		break
	}
	return f.i > start && f.take('"')
}

// space skips XML white space, and says whether there was any.
func (f *fastTokens) space() bool {
	start := f.i
	for f.i < len(f.b) && (f.b[f.i] == ' ' || f.b[f.i] == '\t' || f.b[f.i] == '\n') {
		f.i++
	}
	return f.i > start
}

func (f *fastTokens) take(c byte) bool {
	if f.i < len(f.b) && f.b[f.i] == c {
		f.i++
		return true
	}
	return false
}

func plainASCII(b []byte) bool {
	for _, c := range b {
		if (c < 0x20 || c >= 0x7f) && c != '\n' && c != '\t' {
			return false
		}
	}
	return true
}
