package mdmplist

import (
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf16"
)

// A bplist00 is "bplist00", the objects, a table of their offsets, and a
// 32-byte trailer (CFBinaryPlistTrailer: 5 unused bytes, sort version,
// offset int size, object ref size, then 8 bytes each: number of objects,
// top object, offset table offset). An object is a marker byte (type in
// the high nibble, a count or size in the low one, 0xF for "a length int
// follows") and its content; arrays and dicts hold object refs, dicts
// their keys' first. The scanner checks trailer and offsets against the
// bytes present, then walks from the top object with an explicit stack,
// each object once: a memo holds each one's size as a tree would expand
// it, so shared refs count as a tree-building decoder meets them without
// being walked again, and an object met while being walked contains
// itself. Linear in the bytes read.

const bplistMagic = "bplist00"

const (
	trailerSize = 32
	// headerSize is the magic's; objects start there.
	headerSize = len(bplistMagic)
)

// Object types, the marker's high nibble.
const (
	tSingleton = 0x0
	tInt       = 0x1
	tReal      = 0x2
	tDate      = 0x3
	tData      = 0x4
	tASCII     = 0x5
	tUTF16     = 0x6
	tUID       = 0x8
	tArray     = 0xA
	tOrdSet    = 0xB
	tSet       = 0xC
	tDict      = 0xD
)

func typeName(t byte) string {
	switch t {
	case tSingleton:
		return "bool"
	case tInt:
		return "integer"
	case tReal:
		return "real"
	case tDate:
		return "date"
	case tData:
		return "data"
	case tASCII, tUTF16:
		return "string"
	case tArray:
		return "array"
	case tDict:
		return "dict"
	}
	return fmt.Sprintf("object of type 0x%x", t)
}

// aType is typeName with its article.
func aType(t byte) string {
	name := typeName(t)
	if strings.ContainsRune("aeiou", rune(name[0])) {
		return "an " + name
	}
	return "a " + name
}

// Memo states of an object; a walked object's state is its size + 1.
const (
	unwalked  uint32 = 0
	inWalk    uint32 = 1
	sizeShift uint32 = 1
)

type bplist struct {
	data     []byte
	lim      Limits
	offSize  int // bytes of an offset in the offset table
	refSize  int // bytes of an object ref
	numObjs  int
	tableAt  int // the offset table's offset: where the object area ends
	state    []uint32
	walkRoot int
	// refsLeft is how many more refs the walk may read: as many as the
	// object area holds. Each object is walked once, so only objects that
	// overlap (which no writer makes) can use it up; it keeps the walk
	// linear in the file's size even then.
	refsLeft int
}

// object is an object's header, checked against the bytes left.
type object struct {
	typ   byte
	count uint64 // array elements, dict entries, string characters, data bytes
	body  int    // offset of what follows the marker and its length
}

func scanBinary(data []byte, lim Limits, keys []string) (map[string]string, error) {
	p, err := openBinary(data, lim)
	if err != nil {
		return nil, err
	}
	if err := p.walk(); err != nil {
		return nil, err
	}
	return p.topLevelStrings(keys)
}

func openBinary(data []byte, lim Limits) (*bplist, error) {
	const least = headerSize + 1 + 1 + trailerSize // one object of one byte, one offset
	if len(data) < least {
		return nil, fmt.Errorf("binary plist: %d bytes is too short (a binary plist has at least %d)", len(data), least)
	}
	trailerAt := len(data) - trailerSize
	tr := data[trailerAt:]
	offSize, refSize := int(tr[6]), int(tr[7])
	numObjs := binary.BigEndian.Uint64(tr[8:16])
	root := binary.BigEndian.Uint64(tr[16:24])
	tableAt := binary.BigEndian.Uint64(tr[24:32])
	switch {
	case offSize < 1 || offSize > 8:
		return nil, fmt.Errorf("binary plist: offset int size %d, want 1 to 8", offSize)
	case refSize < 1 || refSize > 8:
		return nil, fmt.Errorf("binary plist: object ref size %d, want 1 to 8", refSize)
	case numObjs == 0:
		return nil, fmt.Errorf("binary plist: no objects")
	case tableAt <= uint64(headerSize) || tableAt >= uint64(trailerAt):
		return nil, fmt.Errorf("binary plist: offset table at %d is outside the file's %d to %d", tableAt, headerSize+1, trailerAt-1)
	}
	room := uint64(trailerAt) - tableAt
	if numObjs > room/uint64(offSize) {
		return nil, fmt.Errorf("binary plist: %d objects claimed, but the offset table has room for %d", numObjs, room/uint64(offSize))
	}
	if numObjs*uint64(offSize) != room {
		return nil, fmt.Errorf("binary plist: the offset table of %d objects ends at %d, not at the trailer (%d)", numObjs, tableAt+numObjs*uint64(offSize), trailerAt)
	}
	if numObjs > uint64(lim.MaxElements) {
		return nil, fmt.Errorf("binary plist: %d objects, more than the %d-element limit", numObjs, lim.MaxElements)
	}
	if root >= numObjs {
		return nil, fmt.Errorf("binary plist: top object %d is out of range (%d objects)", root, numObjs)
	}
	p := &bplist{data: data, lim: lim, offSize: offSize, refSize: refSize,
		numObjs: int(numObjs), tableAt: int(tableAt), walkRoot: int(root),
		refsLeft: (int(tableAt) - headerSize) / refSize}
	for i := 0; i < p.numObjs; i++ {
		if off := p.offsetRaw(i); off < uint64(headerSize) || off >= tableAt {
			return nil, fmt.Errorf("binary plist: object %d at offset %d is outside the object area (%d to %d)", i, off, headerSize, tableAt-1)
		}
	}
	p.state = make([]uint32, p.numObjs) // numObjs fits the bytes present and the limit
	return p, nil
}

func readUint(b []byte, n int) uint64 {
	var v uint64
	for _, c := range b[:n] {
		v = v<<8 | uint64(c)
	}
	return v
}

func (p *bplist) offsetRaw(i int) uint64 {
	return readUint(p.data[p.tableAt+i*p.offSize:], p.offSize)
}

// offset is object i's offset, checked in openBinary.
func (p *bplist) offset(i int) int { return int(p.offsetRaw(i)) }

// object reads and checks object i's header: its type is a plist value's,
// and what it claims to hold fits the bytes left in the object area.
func (p *bplist) object(i int) (object, error) {
	at := p.offset(i)
	m := p.data[at]
	typ, lo := m>>4, m&0xf
	at++
	left := p.tableAt - at
	need := func(n int) (object, error) {
		if n > left {
			return object{}, fmt.Errorf("binary plist: %s at object %d needs %d bytes, more than the %d bytes left", typeName(typ), i, n, left)
		}
		return object{typ: typ, body: at}, nil
	}
	switch typ {
	case tSingleton:
		if lo == 0x8 || lo == 0x9 {
			return object{typ: typ, body: at}, nil
		}
		return object{}, fmt.Errorf("binary plist: object %d has marker 0x%02x (null or fill), which is no plist value", i, m)
	case tInt:
		if lo > 4 {
			return object{}, fmt.Errorf("binary plist: integer at object %d is %d bytes long, more than 16", i, uint64(1)<<lo)
		}
		return need(1 << lo)
	case tReal:
		if lo != 2 && lo != 3 {
			return object{}, fmt.Errorf("binary plist: real at object %d has marker 0x%02x, want 0x22 or 0x23", i, m)
		}
		return need(1 << lo)
	case tDate:
		if lo != 3 {
			return object{}, fmt.Errorf("binary plist: date at object %d has marker 0x%02x, want 0x33", i, m)
		}
		return need(8)
	case tData, tASCII, tUTF16, tArray, tDict:
		count := uint64(lo)
		if lo == 0xf {
			if left < 1 {
				return object{}, fmt.Errorf("binary plist: %s at object %d: its length is cut off", typeName(typ), i)
			}
			lm := p.data[at]
			if lm>>4 != tInt || lm&0xf > 3 {
				return object{}, fmt.Errorf("binary plist: %s at object %d has length marker 0x%02x, want 0x10 to 0x13", typeName(typ), i, lm)
			}
			n := 1 << (lm & 0xf)
			if 1+n > left {
				return object{}, fmt.Errorf("binary plist: %s at object %d: its length is cut off", typeName(typ), i)
			}
			count = readUint(p.data[at+1:], n)
			at += 1 + n
			left -= 1 + n
		}
		unit, what := uint64(1), "bytes"
		switch typ {
		case tASCII:
			what = "characters"
		case tUTF16:
			unit, what = 2, "characters"
		case tArray:
			unit, what = uint64(p.refSize), "elements"
		case tDict:
			unit, what = 2*uint64(p.refSize), "entries"
		}
		if count > uint64(left)/unit {
			return object{}, fmt.Errorf("binary plist: %s at object %d claims %d %s, more than the %d bytes left", typeName(typ), i, count, what, left)
		}
		return object{typ: typ, count: count, body: at}, nil
	case tUID:
		return object{}, fmt.Errorf("binary plist: object %d is a keyed archive's UID (marker 0x%02x), which is no plist value", i, m)
	case tOrdSet, tSet:
		return object{}, fmt.Errorf("binary plist: object %d is a set (marker 0x%02x), which is no plist value", i, m)
	}
	return object{}, fmt.Errorf("binary plist: object %d has unknown marker 0x%02x", i, m)
}

// refs is how many object refs o holds.
func (o object) refs() uint64 {
	switch o.typ {
	case tArray:
		return o.count
	case tDict:
		return 2 * o.count
	}
	return 0
}

func isString(typ byte) bool { return typ == tASCII || typ == tUTF16 }

// walkFrame is a dict or array being walked.
type walkFrame struct {
	obj  int
	at   int    // offset of its next ref
	left uint64 // refs left to read
	keys uint64 // of which dict keys
	size uint64 // 1 + the sizes of the children read so far
}

// walk checks every object reachable from the top one, in depth-first
// order, with the depth, cycle and expanded-size limits.
func (p *bplist) walk() error {
	root, err := p.object(p.walkRoot)
	if err != nil {
		return err
	}
	if root.refs() == 0 {
		p.state[p.walkRoot] = 1 + sizeShift
		return nil
	}
	if p.lim.MaxDepth < 2 {
		return depthError(p.lim)
	}
	stack := []walkFrame{p.frame(p.walkRoot, root)}
	p.state[p.walkRoot] = inWalk
	for len(stack) > 0 {
		f := &stack[len(stack)-1]
		if f.left == 0 {
			p.state[f.obj] = uint32(f.size) + sizeShift
			size := f.size
			stack = stack[:len(stack)-1]
			if len(stack) > 0 {
				if err := p.add(&stack[len(stack)-1], size); err != nil {
					return err
				}
			}
			continue
		}
		if p.refsLeft--; p.refsLeft < 0 {
			return fmt.Errorf("binary plist: objects overlap: more refs read than the object area holds (%d)", (p.tableAt-headerSize)/p.refSize)
		}
		ref := readUint(p.data[f.at:], p.refSize)
		f.at += p.refSize
		f.left--
		isKey := f.keys > 0
		if isKey {
			f.keys--
		}
		if ref >= uint64(p.numObjs) {
			return fmt.Errorf("binary plist: %s at object %d refers to object %d; there are %d", typeName(p.typeOf(f.obj)), f.obj, ref, p.numObjs)
		}
		c := int(ref)
		switch st := p.state[c]; {
		case st == inWalk:
			return fmt.Errorf("binary plist: object %d contains itself", c)
		case st != unwalked:
			if isKey && !isString(p.typeOf(c)) {
				return p.keyError(f.obj, c, p.typeOf(c))
			}
			if err := p.add(f, uint64(st-sizeShift)); err != nil {
				return err
			}
			continue
		}
		child, err := p.object(c)
		if err != nil {
			return err
		}
		if isKey && !isString(child.typ) {
			return p.keyError(f.obj, c, child.typ)
		}
		// the child is at level len(stack)+1; a container's children one deeper
		if child.refs() == 0 {
			p.state[c] = 1 + sizeShift
			if err := p.add(f, 1); err != nil {
				return err
			}
			continue
		}
		if len(stack)+2 > p.lim.MaxDepth {
			return depthError(p.lim)
		}
		p.state[c] = inWalk
		stack = append(stack, p.frame(c, child))
	}
	return nil
}

func (p *bplist) frame(i int, o object) walkFrame {
	f := walkFrame{obj: i, at: o.body, left: o.refs(), size: 1}
	if o.typ == tDict {
		f.keys = o.count
	}
	return f
}

func (p *bplist) add(f *walkFrame, size uint64) error {
	f.size += size
	if f.size > uint64(p.lim.MaxElements) {
		return elementsError(p.lim)
	}
	return nil
}

func (p *bplist) keyError(dict, key int, typ byte) error {
	return fmt.Errorf("binary plist: dict at object %d has a key that is %s (object %d), not a string", dict, aType(typ), key)
}

func (p *bplist) typeOf(i int) byte { return p.data[p.offset(i)] >> 4 }

// topLevelStrings reads the wanted keys of the root dict, once the walk
// has checked every object.
func (p *bplist) topLevelStrings(keys []string) (map[string]string, error) {
	root, err := p.object(p.walkRoot)
	if err != nil {
		return nil, err
	}
	if root.typ != tDict {
		return nil, fmt.Errorf("binary plist: the root is %s, not a dict", aType(root.typ))
	}
	want := make([][]uint16, len(keys))
	for i, k := range keys {
		want[i] = utf16.Encode([]rune(k))
	}
	out := map[string]string{}
	n := int(root.count)
	for e := 0; e < n; e++ {
		k := int(readUint(p.data[root.body+e*p.refSize:], p.refSize))
		key, _ := p.object(k) // walked: a string
		w := p.match(key, keys, want)
		if w < 0 {
			continue
		}
		v := int(readUint(p.data[root.body+(n+e)*p.refSize:], p.refSize))
		val, _ := p.object(v)
		if !isString(val.typ) {
			return nil, fmt.Errorf("binary plist: top-level %q is %s, not a string", keys[w], aType(val.typ))
		}
		if _, dup := out[keys[w]]; dup {
			return nil, fmt.Errorf("binary plist: top-level key %q appears twice", keys[w])
		}
		s, err := p.decodeString(v, val)
		if err != nil {
			return nil, err
		}
		out[keys[w]] = s
	}
	return out, nil
}

// match returns the index of the wanted key that string object o is, or
// -1; its cost is bounded by the wanted keys' lengths, whatever o's.
func (p *bplist) match(o object, keys []string, want [][]uint16) int {
	for i, k := range keys {
		switch o.typ {
		case tASCII:
			if o.count == uint64(len(k)) && string(p.data[o.body:o.body+len(k)]) == k {
				return i
			}
		case tUTF16:
			if o.count != uint64(len(want[i])) {
				continue
			}
			same := true
			for j, u := range want[i] {
				if binary.BigEndian.Uint16(p.data[o.body+2*j:]) != u {
					same = false
					break
				}
			}
			if same {
				return i
			}
		}
	}
	return -1
}

func (p *bplist) decodeString(i int, o object) (string, error) {
	n := int(o.count) // checked against the bytes left
	if o.typ == tASCII {
		b := p.data[o.body : o.body+n]
		for _, c := range b {
			if c >= 0x80 {
				return "", fmt.Errorf("binary plist: ASCII string at object %d holds byte 0x%02x", i, c)
			}
		}
		return string(b), nil
	}
	u := make([]uint16, n)
	for j := range u {
		u[j] = binary.BigEndian.Uint16(p.data[o.body+2*j:])
	}
	return string(utf16.Decode(u)), nil
}
