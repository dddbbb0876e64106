package plisttest

import (
	"strings"
)

// Case is a plist that must be refused.
type Case struct {
	Name string // also its fuzz corpus file's name
	Data []byte
	Want string // in the error
	// Harm is what github.com/micromdm/plist v0.2.2's Unmarshal does with
	// it, where that is worse than an error; never run it on those.
	Harm string
}

// Hostile is the catalogue of plists the decoder must refuse quickly, each
// small enough to keep in a fuzz corpus.
func Hostile() []Case {
	var cases []Case
	add := func(name, want, harm string, data []byte) {
		cases = append(cases, Case{Name: name, Data: data, Want: want, Harm: harm})
	}
	status := func(objs ...[]byte) [][]byte {
		// object 0: {Status: "Acknowledged", QueryResponses: object 4}, then objs from 4 on
		return append([][]byte{Dict(1, 1, 2, 3, 4), ASCII("Status"), ASCII("Acknowledged"), ASCII("QueryResponses")}, objs...)
	}

	// Claims larger than the file: micromdm/plist allocates them.
	add("bin-array-claims-2e40-elements", "array at object 4 claims 1099511627776 elements, more than the 0 bytes left",
		"fatal: out of memory (make([]*plistValue, 1<<40))",
		Build(1, status(Header(0xA, 1<<40))...))
	add("bin-array-claims-2e40-elements-minimal", "array at object 0 claims 1099511627776 elements",
		"fatal: out of memory", Build(1, Header(0xA, 1<<40)))
	add("bin-string-claims-2e40-bytes", "string at object 4 claims 1099511627776 characters",
		"fatal: out of memory (make([]byte, 1<<40))",
		Build(1, status(Header(0x5, 1<<40))...))
	add("bin-utf16-claims-2e62-characters", "string at object 4 claims 4611686018427387904 characters",
		"panic: makeslice: len out of range", Build(1, status(Header(0x6, 1<<62))...))
	add("bin-dict-claims-2e62-entries", "dict at object 4 claims 4611686018427387904 entries",
		"panic: makeslice: len out of range", Build(1, status(Header(0xD, 1<<62))...))
	add("bin-data-claims-2e40-bytes", "data at object 4 claims 1099511627776 bytes",
		"fatal: out of memory", Build(1, status(Header(0x4, 1<<40))...))

	// Cycles: micromdm/plist recurses until the stack is gone.
	add("bin-array-contains-itself", "object 4 contains itself", "fatal: stack overflow",
		Build(1, status(Array(1, 4))...))
	add("bin-array-contains-itself-minimal", "object 0 contains itself", "fatal: stack overflow",
		Build(1, Array(1, 0)))
	add("bin-arrays-contain-each-other", "object 4 contains itself", "fatal: stack overflow",
		Build(1, status(Array(1, 5), Array(1, 4))...))
	add("bin-dict-contains-itself", "object 0 contains itself", "fatal: stack overflow",
		Build(1, Dict(1, 1, 2, 3, 0), ASCII("Status"), ASCII("Acknowledged"), ASCII("Self")))

	// Shared references: 2^41-1 elements in any decoder that builds a tree.
	bomb := status()
	for i := 0; i < 40; i++ {
		next := uint64(len(bomb) + 1)
		bomb = append(bomb, Array(1, next, next))
	}
	bomb = append(bomb, ASCII("x"))
	add("bin-shared-reference-bomb-40-levels", "plist has more than 1048576 elements",
		"fatal: out of memory (a tree of 2^41 values)", Build(1, bomb...))

	deep := status()
	for i := 0; i < 200; i++ {
		deep = append(deep, Array(1, uint64(len(deep)+1)))
	}
	deep = append(deep, Bool(true))
	add("bin-nested-200-deep", "plist nested deeper than 128 levels", "", Build(1, deep...))

	// Trailers that lie: micromdm/plist panics (a 500 instead of a 400).
	good := ResultBinary("Acknowledged", "U-1", "D-1")
	n := ReadTrailer(good).NumObjects
	add("bin-top-object-out-of-range", "top object", "panic: index out of range",
		WithTrailer(good, func(t *Trailer) { t.Root = n }))
	add("bin-object-ref-size-9", "object ref size 9", "panic: slice bounds out of range",
		WithTrailer(good, func(t *Trailer) { t.ObjectRefSize = 9 }))
	add("bin-object-ref-size-0", "object ref size 0", "fatal: stack overflow (every ref reads as 0)", WithTrailer(good, func(t *Trailer) { t.ObjectRefSize = 0 }))
	add("bin-offset-int-size-9", "offset int size 9", "", WithTrailer(good, func(t *Trailer) { t.OffsetIntSize = 9 }))
	add("bin-offset-int-size-0", "offset int size 0", "", WithTrailer(good, func(t *Trailer) { t.OffsetIntSize = 0 }))
	add("bin-2e62-objects", "4611686018427387904 objects claimed", "",
		WithTrailer(good, func(t *Trailer) { t.NumObjects = 1 << 62 }))
	add("bin-no-objects", "no objects", "panic: index out of range", WithTrailer(good, func(t *Trailer) { t.NumObjects = 0 }))
	add("bin-offset-table-beyond-the-file", "offset table at 1099511627776", "",
		WithTrailer(good, func(t *Trailer) { t.OffsetTableAt = 1 << 40 }))
	add("bin-offset-into-the-trailer", "outside the object area", "", WithOffset(good, 0, uint64(len(good)-4)))
	refs := make([]uint64, 200)
	for i := range refs {
		refs[i] = 7
	}
	overlap := Build(1, append(status(Array(1, 5, 6)), Array(1, refs...), Bool(false), Bool(true))...)
	add("bin-overlapping-objects", "objects overlap", "", WithOffset(overlap, 6, Offset(overlap, 5))) // objects 5 and 6 are one array
	add("bin-too-short", "too short", "", []byte("bplist00\xd0\x08\x00\x00"))
	add("bin-version-01", "version", "", append([]byte("bplist01"), good[8:]...))

	// Objects that are no plist values, or cut off.
	add("bin-ref-out-of-range", "refers to object 200", "", Build(1, status(Array(1, 200))...))
	add("bin-ref-one-past-the-end", "refers to object 5; there are 5", "panic: index out of range", Build(1, status(Array(1, 5))...))
	add("bin-key-is-an-integer", "has a key that is an integer", "",
		Build(1, Dict(1, 1, 2), Int(7), ASCII("Acknowledged")))
	add("bin-length-marker-0x23", "length marker 0x23", "panic: makeslice: len out of range", Build(1, status([]byte{0x5f, 0x23, 1, 2, 3, 4, 5, 6, 7, 8})...))
	add("bin-uid-object", "UID", "", Build(1, status([]byte{0x80, 0x01})...))
	add("bin-null-object", "null or fill", "", Build(1, status([]byte{0x00})...))
	add("bin-unknown-marker-0x70", "unknown marker 0x70", "", Build(1, status([]byte{0x70})...))
	add("bin-integer-cut-off", "integer at object 4 needs 8 bytes, more than the 2 bytes left", "",
		Build(1, status([]byte{0x13, 1, 2})...))
	add("bin-real-16-bytes", "real at object 4", "", Build(1, status([]byte{0x24, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})...))
	add("bin-root-is-an-array", "the root is an array, not a dict", "", Build(1, Array(1, 1), ASCII("x")))
	add("bin-status-is-an-integer", `top-level "Status" is an integer, not a string`, "",
		Build(1, Dict(1, 1, 2), ASCII("Status"), Int(7)))
	add("bin-status-twice", `top-level key "Status" appears twice`, "",
		Build(1, Dict(1, 1, 2, 3, 2), ASCII("Status"), ASCII("Acknowledged"), UTF16("Status")))

	// XML.
	add("xml-nested-1000-deep", "plist nested deeper than 128 levels", "", DeepXML(1000))
	add("xml-unclosed-arrays", "root is <array>, not a dict", "", []byte(strings.Repeat("<array>", 1000)))
	add("xml-entity-expansion", "entity", "", []byte(`<?xml version="1.0"?>
<!DOCTYPE plist [<!ENTITY a "aaaaaaaaaa"><!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;"><!ENTITY c "&b;&b;&b;&b;&b;&b;&b;&b;&b;&b;">]>
<plist version="1.0"><dict><key>Status</key><string>&c;</string></dict></plist>`))
	add("xml-unknown-element", "unknown element <foo>", "", []byte(`<plist><dict><key>Status</key><foo/></dict></plist>`))
	add("xml-two-keys-in-a-row", "two keys in a row", "", []byte(`<plist><dict><key>Status</key><key>Status</key><string>x</string></dict></plist>`))
	add("xml-element-in-a-string", "<string> holds an element <dict>", "", []byte(`<plist><dict><key>Status</key><string><dict/></string></dict></plist>`))
	add("xml-two-values", "more than one value", "", []byte(`<plist><dict/><dict/></plist>`))
	add("xml-after-the-plist", "after the plist", "", []byte(`<plist><dict/></plist><plist><dict/></plist>`))
	add("xml-status-twice", `top-level key "Status" appears twice`, "", []byte(`<plist><dict><key>Status</key><string>A</string><key>Status</key><string>B</string></dict></plist>`))
	add("xml-status-is-an-integer", `top-level "Status" is a <integer>`, "", []byte(`<plist><dict><key>Status</key><integer>1</integer></dict></plist>`))
	add("xml-bad-integer", "not a 64-bit integer", "", []byte(`<plist><dict><key>N</key><integer>99999999999999999999</integer></dict></plist>`))
	add("xml-bad-data", "not standard base64", "", []byte(`<plist><dict><key>D</key><data>!!!!</data></dict></plist>`))
	add("xml-text-between-elements", "outside a value", "", []byte(`<plist><dict>hello<key>a</key><true/></dict></plist>`))
	add("xml-not-closed", "unexpected EOF", "", []byte(`<plist><dict><key>Status</key><string>A`))
	add("xml-key-without-value", "key that has no value", "", []byte(`<plist><dict><key>Status</key></dict></plist>`))
	add("not-a-plist", "outside a value", "", []byte("hello there"))
	add("xml-only-a-declaration", "no plist value", "", []byte(`<?xml version="1.0"?>`))
	return cases
}

// DeepXML is a result plist whose "Deep" value is levels arrays nested.
func DeepXML(levels int) []byte {
	var b strings.Builder
	b.Grow(16*levels + 256)
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<plist version="1.0"><dict><key>Status</key><string>Acknowledged</string><key>CommandUUID</key><string>U-1</string><key>Deep</key>`)
	b.WriteString(strings.Repeat("<array>", levels))
	b.WriteString(strings.Repeat("</array>", levels))
	b.WriteString("</dict></plist>")
	return []byte(b.String())
}
