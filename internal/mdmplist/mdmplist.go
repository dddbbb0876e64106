// Package mdmplist is the bounded boundary for every property list that
// comes from outside (a device's result or check-in, relayed by NanoMDM).
//
// It checks that the bytes are one well-formed plist, XML or binary
// (bplist00), within Limits, and reads the top-level string values a caller
// names, without building a tree of the document. Work and memory are
// linear in the size of the input whatever counts, offsets or references
// the input claims: nothing is allocated from a claimed count before it is
// checked against the bytes present, nesting is bounded, a binary object
// that contains itself is refused, and so is a binary plist whose shared
// references would expand past MaxElements in a decoder that builds a tree
// (NanoCMD's, which later decodes what this package let through).
package mdmplist

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Limits bounds what a plist may hold.
type Limits struct {
	// MaxDepth is how deeply values may nest: the root value is level 1,
	// the values (and keys) of a root dict level 2, and so on.
	MaxDepth int
	// MaxElements is how many values and dict keys the plist may hold, a
	// binary object counted once for every reference to it (as it counts
	// in a decoder that builds a tree).
	MaxElements int
}

// DefaultLimits: an MDM result nests a handful of levels (a QueryResponses
// dict, an ErrorChain of dicts, a profile's payload content) and holds at
// most a few hundred thousand elements (an InstalledApplicationList of
// 3000 apps is about 60 000); 128 levels keep any recursive decoder far
// from the end of its stack, and 1<<20 elements keep a tree of the document
// to a few hundred MiB at worst.
var DefaultLimits = Limits{MaxDepth: 128, MaxElements: 1 << 20}

// maxElements caps Limits.MaxElements so that element counts fit the
// binary walker's uint32 memo.
const maxElements = 1 << 30

func (l Limits) orDefaults() Limits {
	if l.MaxDepth <= 0 {
		l.MaxDepth = DefaultLimits.MaxDepth
	}
	if l.MaxElements <= 0 {
		l.MaxElements = DefaultLimits.MaxElements
	}
	if l.MaxElements > maxElements {
		l.MaxElements = maxElements
	}
	return l
}

// TopLevelStrings checks that data is one well-formed plist (XML, or binary
// bplist00) within lim, and returns the string values of the keys of its
// top-level dict that are named in keys; a key that is absent is absent
// from the map. A zero field of lim takes its value from DefaultLimits.
//
// It is an error when the root is not a dict, and when a named key appears
// twice or holds something other than a string. Every error is one line
// saying what is wrong.
func TopLevelStrings(data []byte, lim Limits, keys ...string) (map[string]string, error) {
	lim = lim.orDefaults()
	var out map[string]string
	var err error
	switch {
	case bytes.HasPrefix(data, []byte(bplistMagic)):
		out, err = scanBinary(data, lim, keys)
	case bytes.HasPrefix(data, []byte("bplist")):
		err = fmt.Errorf("binary plist: version %s is not supported, only 00", quoteShort(data[6:min(len(data), 8)]))
	default:
		out, err = scanXML(data, lim, keys)
	}
	if err != nil {
		return nil, oneLine(err)
	}
	return out, nil
}

func depthError(lim Limits) error {
	return fmt.Errorf("plist nested deeper than %d levels", lim.MaxDepth)
}

func elementsError(lim Limits) error {
	return fmt.Errorf("plist has more than %d elements", lim.MaxElements)
}

// wanted reports whether key is one of keys.
func wanted(keys []string, key []byte) (string, bool) {
	for _, k := range keys {
		if string(key) == k {
			return k, true
		}
	}
	return "", false
}

// quoteShort quotes (part of) input for an error message.
func quoteShort(b []byte) string {
	const max = 40
	if len(b) > max {
		return strconv.Quote(string(b[:max])) + "…"
	}
	return strconv.Quote(string(b))
}

// oneLine makes sure an error (which may quote input through encoding/xml)
// is one line.
func oneLine(err error) error {
	msg := err.Error()
	if strings.IndexFunc(msg, func(r rune) bool { return r < 0x20 || r == 0x7f }) < 0 {
		return err
	}
	return errors.New(strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, msg))
}
