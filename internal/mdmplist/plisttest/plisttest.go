// Package plisttest builds plists for tests: binary plists byte by byte
// (micromdm/plist v0.2.2 writes only XML), result plists as NanoMDM relays
// them, and the catalogue of hostile plists that once killed or could kill
// the webhook decoder.
package plisttest

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strings"
	"time"
	"unicode/utf16"
)

// Trailer is a bplist00's last 32 bytes.
type Trailer struct {
	OffsetIntSize, ObjectRefSize    uint8
	NumObjects, Root, OffsetTableAt uint64
}

// Build lays out a bplist00: the magic, objects in order (object 0 first),
// the offset table with the smallest offset int size that fits, and a
// trailer naming object 0 the top object.
func Build(refSize int, objects ...[]byte) []byte {
	b := []byte("bplist00")
	offsets := make([]uint64, len(objects))
	for i, o := range objects {
		offsets[i] = uint64(len(b))
		b = append(b, o...)
	}
	tableAt := uint64(len(b))
	offSize := uintSize(tableAt)
	for _, off := range offsets {
		b = appendUint(b, off, offSize)
	}
	return putTrailer(b, Trailer{OffsetIntSize: uint8(offSize), ObjectRefSize: uint8(refSize),
		NumObjects: uint64(len(objects)), OffsetTableAt: tableAt})
}

// ReadTrailer reads b's trailer.
func ReadTrailer(b []byte) Trailer {
	t := b[len(b)-32:]
	return Trailer{OffsetIntSize: t[6], ObjectRefSize: t[7], NumObjects: binary.BigEndian.Uint64(t[8:]),
		Root: binary.BigEndian.Uint64(t[16:]), OffsetTableAt: binary.BigEndian.Uint64(t[24:])}
}

// WithTrailer returns a copy of b with its trailer changed by edit.
func WithTrailer(b []byte, edit func(*Trailer)) []byte {
	t := ReadTrailer(b)
	edit(&t)
	return putTrailer(append([]byte(nil), b[:len(b)-32]...), t)
}

// Offset is object i's offset.
func Offset(b []byte, i int) uint64 {
	t := ReadTrailer(b)
	n := int(t.OffsetIntSize)
	var v uint64
	for _, c := range b[int(t.OffsetTableAt)+i*n:][:n] {
		v = v<<8 | uint64(c)
	}
	return v
}

// WithOffset returns a copy of b with object i's offset set to off.
func WithOffset(b []byte, i int, off uint64) []byte {
	t := ReadTrailer(b)
	n := int(t.OffsetIntSize)
	b = append([]byte(nil), b...)
	copy(b[int(t.OffsetTableAt)+i*n:], appendUint(nil, off, n))
	return b
}

func putTrailer(b []byte, t Trailer) []byte {
	b = append(b, 0, 0, 0, 0, 0, 0, t.OffsetIntSize, t.ObjectRefSize)
	b = binary.BigEndian.AppendUint64(b, t.NumObjects)
	b = binary.BigEndian.AppendUint64(b, t.Root)
	return binary.BigEndian.AppendUint64(b, t.OffsetTableAt)
}

func uintSize(v uint64) int {
	n := 1
	for v >= 1<<(8*n) && n < 8 {
		n++
	}
	return n
}

func appendUint(b []byte, v uint64, n int) []byte {
	for i := n - 1; i >= 0; i-- {
		b = append(b, byte(v>>(8*i)))
	}
	return b
}

// Header is an object's marker with count, extended with a length int
// when count does not fit the low nibble.
func Header(typ byte, count uint64) []byte {
	if count < 15 {
		return []byte{typ<<4 | byte(count)}
	}
	switch {
	case count <= math.MaxUint8:
		return []byte{typ<<4 | 0xf, 0x10, byte(count)}
	case count <= math.MaxUint16:
		return binary.BigEndian.AppendUint16([]byte{typ<<4 | 0xf, 0x11}, uint16(count))
	case count <= math.MaxUint32:
		return binary.BigEndian.AppendUint32([]byte{typ<<4 | 0xf, 0x12}, uint32(count))
	}
	return binary.BigEndian.AppendUint64([]byte{typ<<4 | 0xf, 0x13}, count)
}

// ASCII is an ASCII string object.
func ASCII(s string) []byte { return append(Header(0x5, uint64(len(s))), s...) }

// UTF16 is a UTF-16 string object.
func UTF16(s string) []byte {
	u := utf16.Encode([]rune(s))
	b := Header(0x6, uint64(len(u)))
	for _, c := range u {
		b = binary.BigEndian.AppendUint16(b, c)
	}
	return b
}

// Int is an 8-byte integer object.
func Int(v int64) []byte { return binary.BigEndian.AppendUint64([]byte{0x13}, uint64(v)) }

// Real is an 8-byte real object.
func Real(f float64) []byte { return binary.BigEndian.AppendUint64([]byte{0x23}, math.Float64bits(f)) }

// Bool is a boolean object.
func Bool(v bool) []byte {
	if v {
		return []byte{0x09}
	}
	return []byte{0x08}
}

// Date is a date object.
func Date(t time.Time) []byte {
	secs := float64(t.Sub(time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC))) / float64(time.Second)
	return binary.BigEndian.AppendUint64([]byte{0x33}, math.Float64bits(secs))
}

// Data is a data object.
func Data(d []byte) []byte { return append(Header(0x4, uint64(len(d))), d...) }

// Array is an array object of refs.
func Array(refSize int, refs ...uint64) []byte {
	b := Header(0xA, uint64(len(refs)))
	for _, r := range refs {
		b = appendUint(b, r, refSize)
	}
	return b
}

// Dict is a dict object; kv are key and value refs in pairs.
func Dict(refSize int, kv ...uint64) []byte {
	b := Header(0xD, uint64(len(kv)/2))
	for i := 0; i < len(kv); i += 2 {
		b = appendUint(b, kv[i], refSize)
	}
	for i := 1; i < len(kv); i += 2 {
		b = appendUint(b, kv[i], refSize)
	}
	return b
}

// Encode writes v as a bplist00, one object per value (no sharing), v the
// top object. v is made of map[string]any, []any, string, int, int64,
// float64, bool, []byte and time.Time; a string that is not ASCII is
// written as UTF-16.
func Encode(v any) []byte {
	refSize := uintSize(uint64(count(v)))
	var objs [][]byte
	var add func(v any) uint64
	add = func(v any) uint64 {
		i := uint64(len(objs))
		objs = append(objs, nil)
		var o []byte
		switch v := v.(type) {
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var kv []uint64
			for _, k := range keys {
				kr := add(k)
				kv = append(kv, kr, add(v[k]))
			}
			o = Dict(refSize, kv...)
		case []any:
			var refs []uint64
			for _, e := range v {
				refs = append(refs, add(e))
			}
			o = Array(refSize, refs...)
		case string:
			o = ASCII(v)
			for _, r := range v {
				if r >= 0x80 {
					o = UTF16(v)
					break
				}
			}
		case int:
			o = Int(int64(v))
		case int64:
			o = Int(v)
		case float64:
			o = Real(v)
		case bool:
			o = Bool(v)
		case []byte:
			o = Data(v)
		case time.Time:
			o = Date(v)
		default:
			panic(fmt.Sprintf("plisttest.Encode: %T", v))
		}
		objs[i] = o
		return i
	}
	add(v)
	return Build(refSize, objs...)
}

func count(v any) int {
	switch v := v.(type) {
	case map[string]any:
		n := 1
		for _, e := range v {
			n += 1 + count(e)
		}
		return n
	case []any:
		n := 1
		for _, e := range v {
			n += count(e)
		}
		return n
	}
	return 1
}

// Result is a command result as a device reports it: Status, CommandUUID
// and UDID, a QueryResponses dict, and for an Error an ErrorChain.
func Result(status, uuid, udid string) map[string]any {
	r := map[string]any{
		"Status":      status,
		"CommandUUID": uuid,
		"UDID":        udid,
		"QueryResponses": map[string]any{
			"DeviceName":              "Anna’s MacBook Pro",
			"OSVersion":               "15.1",
			"BuildVersion":            "24B83",
			"SerialNumber":            "C02XK0AAJG5H",
			"AvailableDeviceCapacity": 412.5,
			"IsSupervised":            true,
			"BatteryLevel":            0.87,
			"WiFiMAC":                 "a4:83:e7:01:02:03",
			"LastCloudBackupDate":     time.Date(2026, 11, 28, 22, 0, 0, 0, time.UTC),
			"ModelNumber":             "MK183",
		},
	}
	if status == "Error" {
		r["ErrorChain"] = []any{
			map[string]any{"ErrorCode": 4001, "ErrorDomain": "MCProfileErrorDomain",
				"LocalizedDescription": "The profile “Wi-Fi” could not be installed.",
				"USEnglishDescription": "The profile “Wi-Fi” could not be installed."},
			map[string]any{"ErrorCode": 1000, "ErrorDomain": "MCInstallationErrorDomain",
				"LocalizedDescription": "The payload could not be installed."},
		}
	}
	return r
}

// ResultXML is Result as the XML a device sends, the way Apple's
// CFPropertyList writes it.
func ResultXML(status, uuid, udid string) []byte {
	return []byte(XMLDocument(Result(status, uuid, udid)))
}

// ResultBinary is Result as a binary plist.
func ResultBinary(status, uuid, udid string) []byte { return Encode(Result(status, uuid, udid)) }

// XMLDocument writes v (as for Encode) as an XML plist, indented with tabs
// as Apple's writer does.
func XMLDocument(v any) string {
	var b strings.Builder
	b.WriteString(`<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0">
`)
	writeXML(&b, v, 0)
	b.WriteString("</plist>\n")
	return b.String()
}

func writeXML(b *strings.Builder, v any, depth int) {
	tabs := strings.Repeat("\t", depth)
	switch v := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(tabs + "<dict>\n")
		for _, k := range keys {
			fmt.Fprintf(b, "%s\t<key>%s</key>\n", tabs, xmlEscape(k))
			writeXML(b, v[k], depth+1)
		}
		b.WriteString(tabs + "</dict>\n")
	case []any:
		b.WriteString(tabs + "<array>\n")
		for _, e := range v {
			writeXML(b, e, depth+1)
		}
		b.WriteString(tabs + "</array>\n")
	case string:
		fmt.Fprintf(b, "%s<string>%s</string>\n", tabs, xmlEscape(v))
	case int:
		fmt.Fprintf(b, "%s<integer>%d</integer>\n", tabs, v)
	case int64:
		fmt.Fprintf(b, "%s<integer>%d</integer>\n", tabs, v)
	case float64:
		fmt.Fprintf(b, "%s<real>%v</real>\n", tabs, v)
	case bool:
		fmt.Fprintf(b, "%s<%t/>\n", tabs, v)
	case []byte:
		fmt.Fprintf(b, "%s<data>\n%s%s\n%s</data>\n", tabs, tabs, base64.StdEncoding.EncodeToString(v), tabs)
	case time.Time:
		fmt.Fprintf(b, "%s<date>%s</date>\n", tabs, v.UTC().Format(time.RFC3339))
	default:
		panic(fmt.Sprintf("plisttest.XMLDocument: %T", v))
	}
}

func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

// InstalledApplicationList is a large real-world result: n apps.
func InstalledApplicationList(n int, uuid, udid string) map[string]any {
	apps := make([]any, n)
	for i := range apps {
		apps[i] = map[string]any{
			"Identifier":                fmt.Sprintf("com.example.app%04d", i),
			"Name":                      fmt.Sprintf("Example App %d", i),
			"ShortVersion":              "2.4.1",
			"Version":                   "2410",
			"BundleSize":                int64(48_000_000 + i),
			"DynamicSize":               int64(1_200_000 + i),
			"IsValidated":               true,
			"ExternalVersionIdentifier": int64(860000000 + i),
			"Installing":                false,
		}
	}
	return map[string]any{"CommandUUID": uuid, "Status": "Acknowledged", "UDID": udid,
		"InstalledApplicationList": apps}
}
