package mdmplist

import (
	"bytes"
	"encoding/base64"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// The XML scanner reads raw tokens from encoding/xml (strict: no unknown
// entities, so no entity expansion) in one loop, with an explicit stack of
// the open dicts and arrays, never a call per element; it matches end
// elements to start elements itself (encoding/xml's Token would too, at
// the cost of an allocation or two per element). It accepts what
// github.com/micromdm/plist's XML parser accepts, less what no plist writer
// produces: an element holding another where text belongs, a dict key
// without a value, more than one value in <plist> or after it, namespaces,
// a <plist> inside a value, text other than XML white space between
// elements. Every value's text is checked as micromdm/plist checks it, so
// that what this package accepts, micromdm/plist decodes to the same
// strings (FuzzTopLevelStrings checks it).

type xmlFrame struct {
	kind byte // 'p' <plist>, 'd' <dict>, 'a' <array>
	n    int  // elements in it so far (keys and values)
}

func (f xmlFrame) name() string {
	switch f.kind {
	case 'p':
		return "plist"
	case 'd':
		return "dict"
	}
	return "array"
}

func xmlName(n xml.Name) string {
	if n.Space != "" {
		return n.Space + ":" + n.Local
	}
	return n.Local
}

type xmlScanner struct {
	d     tokenSource
	lim   Limits
	keys  []string
	out   map[string]string
	stack []xmlFrame
	// levels is how many dicts and arrays are open (<plist> is not a level).
	levels   int
	elements int
	// topKey is the wanted key whose value, in the root dict, comes next.
	topKey         string
	wantsValue     bool
	text, b64, dec []byte // reused buffers
}

// scanXML reads data with fastTokens, and, when it leaves their subset
// or is refused, again with encoding/xml, whose answer stands (see
// xmlfast.go).
// token is one XML token as xmlScanner reads it: what encoding/xml's
// RawToken gives, without an interface value (and its allocation) per
// token.
type token struct {
	kind   byte
	name   xml.Name // tokStart, tokEnd
	target string   // tokProcInst
	data   []byte   // tokText (entities decoded), tokDirective; valid until the next token
	other  xml.Token
}

const (
	tokStart = iota + 1
	tokEnd
	tokText
	tokComment
	tokProcInst
	tokDirective
	tokOther // other: what encoding/xml gave
)

// tokenSource is what xmlScanner reads: encoding/xml (slowTokens) or
// fastTokens.
type tokenSource interface {
	next() (token, error)
	InputOffset() int64
}

// slowTokens is encoding/xml's RawToken as tokens.
type slowTokens struct{ d *xml.Decoder }

func (s slowTokens) InputOffset() int64 { return s.d.InputOffset() }

func (s slowTokens) next() (token, error) {
	tok, err := s.d.RawToken()
	if err != nil {
		return token{}, err
	}
	switch t := tok.(type) {
	case xml.StartElement:
		return token{kind: tokStart, name: t.Name}, nil
	case xml.EndElement:
		return token{kind: tokEnd, name: t.Name}, nil
	case xml.CharData:
		return token{kind: tokText, data: t}, nil
	case xml.Comment:
		return token{kind: tokComment}, nil
	case xml.ProcInst:
		return token{kind: tokProcInst, target: t.Target}, nil
	case xml.Directive:
		return token{kind: tokDirective, data: t}, nil
	}
	return token{kind: tokOther, other: tok}, nil
}

func scanXML(data []byte, lim Limits, keys []string) (map[string]string, error) {
	s := &xmlScanner{d: newFastTokens(data), lim: lim, keys: keys, out: map[string]string{}}
	if err := s.run(); err == nil {
		return s.out, nil
	}
	return scanXMLSlow(data, lim, keys)
}

// scanXMLSlow reads data with encoding/xml alone.
func scanXMLSlow(data []byte, lim Limits, keys []string) (map[string]string, error) {
	d := xml.NewDecoder(bytes.NewReader(data))
	d.Strict = true
	// asked only for a declared encoding other than UTF-8: encoding/xml's
	// own answer ("Decoder.CharsetReader is nil") tells a sender nothing
	d.CharsetReader = func(string, io.Reader) (io.Reader, error) {
		return nil, errors.New("only UTF-8 is read (what devices send)")
	}
	s := &xmlScanner{d: slowTokens{d}, lim: lim, keys: keys, out: map[string]string{}}
	if err := s.run(); err != nil {
		return nil, err
	}
	return s.out, nil
}

func (s *xmlScanner) errf(format string, args ...any) error {
	return fmt.Errorf("xml plist: "+format+" (at byte %d)", append(args, s.d.InputOffset())...)
}

func (s *xmlScanner) run() error {
	prolog := true // nothing but white space and comments read yet
	doctype, done := false, false
	for {
		t, err := s.d.next()
		if err == io.EOF {
			if len(s.stack) > 0 {
				return s.errf("unexpected EOF: <%s> is not closed", s.stack[len(s.stack)-1].name())
			}
			if !done {
				return errors.New("xml plist: no plist value")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("xml plist: %v", err)
		}
		switch t.kind {
		case tokComment:
		case tokText:
			if !isXMLSpace(t.data) {
				return s.errf("text %s outside a value", quoteShort(t.data))
			}
		case tokProcInst:
			if t.target != "xml" || !prolog {
				return s.errf("unexpected processing instruction <?%s?>", t.target)
			}
			prolog = false
		case tokDirective:
			if doctype || done || len(s.stack) > 0 || !bytes.HasPrefix(t.data, []byte("DOCTYPE")) {
				return s.errf("unexpected directive <!%s>", quoteShort(t.data))
			}
			prolog, doctype = false, true
		case tokStart:
			prolog = false
			if done {
				return s.errf("<%s> after the plist's one value", t.name.Local)
			}
			if err := s.start(t); err != nil {
				return err
			}
			done = len(s.stack) == 0 // a root that is a single element
		case tokEnd:
			if err := s.end(t); err != nil {
				return err
			}
			done = len(s.stack) == 0
		default:
			return s.errf("unexpected %T", t.other)
		}
	}
}

func (s *xmlScanner) start(t token) error {
	name := t.name.Local
	if t.name.Space != "" {
		return s.errf("element <%s> has a namespace prefix; plist elements have none", xmlName(t.name))
	}
	if name == "plist" {
		if len(s.stack) > 0 {
			return s.errf("<plist> inside a value")
		}
		s.stack = append(s.stack, xmlFrame{kind: 'p'})
		return nil
	}
	switch name {
	case "dict", "array", "key", "string", "integer", "real", "true", "false", "data", "date":
	default:
		return s.errf("unknown element <%s>", name)
	}
	var parent *xmlFrame
	if len(s.stack) > 0 {
		parent = &s.stack[len(s.stack)-1]
	}
	isKey := name == "key"
	root := parent == nil || parent.kind == 'p'
	if root {
		switch {
		case isKey:
			return s.errf("<key> outside a dict")
		case parent != nil && parent.n > 0:
			return s.errf("<plist> holds more than one value")
		case name != "dict":
			return s.errf("the plist's root is <%s>, not a dict", name)
		}
	} else {
		switch {
		case parent.kind == 'a' && isKey:
			return s.errf("<key> inside an array")
		case parent.kind == 'd' && isKey && parent.n%2 == 1:
			return s.errf("dict has two keys in a row")
		case parent.kind == 'd' && !isKey && parent.n%2 == 0:
			return s.errf("dict value <%s> has no key", name)
		}
	}
	if parent != nil {
		parent.n++
	}
	if s.elements++; s.elements > s.lim.MaxElements {
		return elementsError(s.lim)
	}
	if s.levels+1 > s.lim.MaxDepth {
		return depthError(s.lim)
	}
	inRootDict := !root && parent.kind == 'd' && s.levels == 1
	if name == "dict" || name == "array" {
		if inRootDict && s.wantsValue {
			return s.errf("top-level %q is a <%s>, not a <string>", s.topKey, name)
		}
		s.wantsValue = false
		s.stack = append(s.stack, xmlFrame{kind: name[0]})
		s.levels++
		return nil
	}
	text, err := s.leaf(name)
	if err != nil {
		return err
	}
	if !inRootDict {
		return nil
	}
	if isKey {
		s.topKey, s.wantsValue = wanted(s.keys, text)
		return nil
	}
	if s.wantsValue {
		s.wantsValue = false
		if name != "string" {
			return s.errf("top-level %q is a <%s>, not a <string>", s.topKey, name)
		}
		if _, dup := s.out[s.topKey]; dup {
			return s.errf("top-level key %q appears twice", s.topKey)
		}
		s.out[s.topKey] = string(text)
	}
	return nil
}

func (s *xmlScanner) end(t token) error {
	if len(s.stack) == 0 {
		return s.errf("unexpected end element </%s>", t.name.Local)
	}
	f := s.stack[len(s.stack)-1]
	if t.name.Space != "" || t.name.Local != f.name() {
		return s.errf("<%s> closed by </%s>", f.name(), xmlName(t.name))
	}
	s.stack = s.stack[:len(s.stack)-1]
	switch f.kind {
	case 'p':
		if f.n == 0 {
			return s.errf("empty <plist>")
		}
	case 'd':
		s.levels--
		if f.n%2 == 1 {
			return s.errf("dict ends with a key that has no value")
		}
	case 'a':
		s.levels--
	}
	return nil
}

// leaf reads the text of the element just started, up to its end, and
// checks it as micromdm/plist does.
func (s *xmlScanner) leaf(name string) ([]byte, error) {
	s.text = s.text[:0]
	for {
		t, err := s.d.next()
		if err == io.EOF {
			return nil, s.errf("unexpected EOF: <%s> is not closed", name)
		}
		if err != nil {
			return nil, fmt.Errorf("xml plist: %v", err)
		}
		switch t.kind {
		case tokText:
			s.text = append(s.text, t.data...)
		case tokComment:
		case tokEnd:
			if t.name.Space != "" || t.name.Local != name {
				return nil, s.errf("<%s> closed by </%s>", name, xmlName(t.name))
			}
			return s.text, s.checkLeaf(name, s.text)
		case tokStart:
			return nil, s.errf("<%s> holds an element <%s>", name, t.name.Local)
		default:
			return nil, s.errf("<%s> holds a %T", name, t.other)
		}
	}
}

func (s *xmlScanner) checkLeaf(name string, text []byte) error {
	switch name {
	case "integer":
		v := trimXMLSpace(text)
		var err error
		if len(v) > 0 && v[0] == '-' {
			_, err = strconv.ParseInt(string(v), 10, 64)
		} else {
			_, err = strconv.ParseUint(string(v), 10, 64)
		}
		if err != nil {
			return s.errf("<integer> %s is not a 64-bit integer", quoteShort(text))
		}
	case "real":
		if len(text) == 0 {
			return nil // encoding/xml reads an empty element as 0
		}
		if _, err := strconv.ParseFloat(string(trimXMLSpace(text)), 64); err != nil {
			return s.errf("<real> %s is not a number", quoteShort(text))
		}
	case "date":
		var t time.Time
		if err := t.UnmarshalText(text); err != nil {
			return s.errf("<date> %s is not an RFC 3339 date", quoteShort(text))
		}
	case "data":
		s.b64 = s.b64[:0]
		for _, c := range text {
			if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
				s.b64 = append(s.b64, c)
			}
		}
		n := base64.StdEncoding.DecodedLen(len(s.b64))
		if cap(s.dec) < n {
			s.dec = make([]byte, n)
		}
		if _, err := base64.StdEncoding.Decode(s.dec[:n], s.b64); err != nil {
			return s.errf("<data> is not standard base64: %v", err)
		}
	case "true", "false":
		if !isXMLSpace(text) {
			return s.errf("<%s/> holds text %s", name, quoteShort(text))
		}
	}
	return nil
}

func trimXMLSpace(b []byte) []byte { return bytes.Trim(b, " \t\r\n") }

func isXMLSpace(b []byte) bool { return len(trimXMLSpace(b)) == 0 }
