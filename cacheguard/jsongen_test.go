package cacheguard_test

import (
	"bytes"
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
)

// jsonDoc has a field of every kind a cached value is made of, with the
// tags and shapes whose decoding rules differ: omitempty, ",string", "-",
// unexported and embedded fields, pointers, interfaces, raw messages,
// numbers, maps with non-string keys, arrays, and types with their own
// UnmarshalJSON or UnmarshalText.
type jsonDoc struct {
	jsonInner
	*jsonOther                    // its "name" conflicts with jsonInner's: neither is decoded
	S          string             `json:"s"`
	I          int                `json:"i,omitempty"`
	I8         int8               `json:"i8"`
	U16        uint16             `json:"u16"`
	F          float64            `json:"f"`
	F32        float32            `json:"f32"`
	B          bool               `json:"b"`
	P          *int               `json:"p"`
	Sl         []string           `json:"sl"`
	M          map[string]int     `json:"m"`
	MI         map[int]string     `json:"mi"`
	A          [2]int             `json:"a"`
	Any        any                `json:"any"`
	Raw        json.RawMessage    `json:"raw"`
	Num        json.Number        `json:"num"`
	Ptr        *jsonInner         `json:"ptr"`
	Bytes      []byte             `json:"bytes"`
	Quoted     int64              `json:"quoted,string"`
	Skip       int                `json:"-"`
	Upper      upperString        `json:"upper"`
	Addr       netip.Addr         `json:"addr"`
	AddrM      map[netip.Addr]int `json:"addrm"`
	Nested     []map[string]bool  `json:"nested"`
	NoTag      string
	hidden     int
}

// jsonTimed holds times and durations, which JSON decodes with
// encoding/json (see cacheguard.JSON).
type jsonTimed struct {
	jsonDoc
	T   time.Time                `json:"t"`
	TP  *time.Time               `json:"tp"`
	Dur time.Duration            `json:"dur"`
	DM  map[string]time.Duration `json:"dm"`
}

// upperString has an UnmarshalJSON of its own.
type upperString string

func (u *upperString) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*u = upperString(strings.ToUpper(s))
	return nil
}

type jsonOther struct {
	Name  string `json:"name"`
	Extra int    `json:"extra"`
}

type jsonInner struct {
	Name string `json:"name"`
	N    uint   `json:"n"`
}

// jsonFieldNames are the keys a corruption may rename, drop or repeat.
var jsonFieldNames = []string{"s", "i", "i8", "u16", "f", "f32", "b", "p", "sl", "m", "mi", "a", "any", "raw",
	"num", "t", "tp", "ptr", "bytes", "quoted", "dur", "dm", "nested", "NoTag", "name", "n", "upper", "addr", "addrm", "extra"}

func genJSONDoc(t *rapid.T) jsonDoc {
	str := rapid.OneOf(rapid.String(), rapid.SampledFrom([]string{"", "a\"b\\c", "\u2028<>&", "é漢字", "\x7f\x01"}))
	d := jsonDoc{
		jsonInner: jsonInner{Name: str.Draw(t, "name"), N: rapid.Uint().Draw(t, "n")},
		S:         str.Draw(t, "s"),
		I:         rapid.Int().Draw(t, "i"),
		I8:        rapid.Int8().Draw(t, "i8"),
		U16:       rapid.Uint16().Draw(t, "u16"),
		F:         rapid.Float64().Filter(func(f float64) bool { return f == f && f-f == 0 }).Draw(t, "f"),
		F32:       rapid.Float32().Filter(func(f float32) bool { return f == f && f-f == 0 }).Draw(t, "f32"),
		B:         rapid.Bool().Draw(t, "b"),
		Sl:        rapid.SliceOfN(str, -1, 4).Draw(t, "sl"),
		M:         rapid.MapOfN(str, rapid.Int(), -1, 3).Draw(t, "m"),
		MI:        rapid.MapOfN(rapid.Int(), str, -1, 3).Draw(t, "mi"),
		A:         [2]int{rapid.Int().Draw(t, "a0"), rapid.Int().Draw(t, "a1")},
		Num:       json.Number(rapid.SampledFrom([]string{"", "0", "-1.5e10", "12345678901234567890"}).Draw(t, "num")),
		Bytes:     rapid.SliceOfN(rapid.Byte(), -1, 8).Draw(t, "bytes"),
		Quoted:    rapid.Int64().Draw(t, "quoted"),
		Upper:     upperString(str.Draw(t, "upper")),
		Addr:      rapid.SampledFrom([]netip.Addr{{}, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("::1")}).Draw(t, "addr"),
		AddrM:     map[netip.Addr]int{netip.MustParseAddr("192.168.1.1"): rapid.Int().Draw(t, "addrm")},
		NoTag:     str.Draw(t, "notag"),
		hidden:    rapid.Int().Draw(t, "hidden"), // never encoded: decoded as zero by both
	}
	if rapid.Bool().Draw(t, "hasOther") {
		d.jsonOther = &jsonOther{Name: str.Draw(t, "oname"), Extra: rapid.Int().Draw(t, "extra")}
	}
	if rapid.Bool().Draw(t, "hasP") {
		p := rapid.Int().Draw(t, "pv")
		d.P = &p
	}
	if rapid.Bool().Draw(t, "hasPtr") {
		d.Ptr = &jsonInner{Name: str.Draw(t, "pname"), N: rapid.Uint().Draw(t, "pn")}
	}
	switch rapid.IntRange(0, 4).Draw(t, "anyKind") {
	case 1:
		d.Any = rapid.Float64Range(-1e6, 1e6).Draw(t, "anyf")
	case 2:
		d.Any = map[string]any{"k": str.Draw(t, "anys"), "l": []any{true, nil, 1.5}}
	case 3:
		d.Any = []any{str.Draw(t, "anys2")}
	}
	if rapid.Bool().Draw(t, "hasRaw") {
		d.Raw = json.RawMessage(rapid.SampledFrom([]string{`{"x": [1, 2]}`, `"s"`, `null`, `3.25`, `[ ]`}).Draw(t, "raw"))
	}
	for range rapid.IntRange(0, 2).Draw(t, "nested") {
		d.Nested = append(d.Nested, rapid.MapOfN(str, rapid.Bool(), -1, 2).Draw(t, "nestedm"))
	}
	return d
}

func genJSONTimed(t *rapid.T) jsonTimed {
	zones := []*time.Location{time.UTC, time.Local, time.FixedZone("", 0), time.FixedZone("X", -7*3600-30*60)}
	tm := time.Unix(rapid.Int64Range(-1e10, 1e10).Draw(t, "sec"), rapid.Int64Range(0, 999999999).Draw(t, "nsec")).
		In(rapid.SampledFrom(zones).Draw(t, "zone"))
	d := jsonTimed{jsonDoc: genJSONDoc(t), T: tm, Dur: time.Duration(rapid.Int64().Draw(t, "dur")),
		DM: map[string]time.Duration{"a": time.Duration(rapid.Int64().Draw(t, "dm"))}}
	if rapid.Bool().Draw(t, "hasTP") {
		d.TP = &tm
	}
	return d
}

// corruptJSON returns b changed as a damaged or foreign entry could be:
// bytes replaced, inserted, deleted or cut off, keys renamed in another case
// or repeated, fields added, values of another type.
func corruptJSON(t *rapid.T, b []byte) []byte {
	b = bytes.Clone(b)
	special := []byte("\"\\{}[]:,0-.eEntfu \x00\x80\xff\b\t")
	switch rapid.IntRange(0, 8).Draw(t, "corruption") {
	case 0:
		return b
	case 1:
		if len(b) > 0 {
			b[rapid.IntRange(0, len(b)-1).Draw(t, "at")] = rapid.SampledFrom(special).Draw(t, "byte")
		}
	case 2:
		i := rapid.IntRange(0, len(b)).Draw(t, "at")
		b = append(b[:i], append([]byte{rapid.SampledFrom(special).Draw(t, "byte")}, b[i:]...)...)
	case 3:
		if len(b) > 0 {
			i := rapid.IntRange(0, len(b)-1).Draw(t, "at")
			b = append(b[:i], b[i+1:]...)
		}
	case 4:
		b = b[:rapid.IntRange(0, len(b)).Draw(t, "len")]
	case 5:
		k := rapid.SampledFrom(jsonFieldNames).Draw(t, "key")
		// Keys match fields case-insensitively, with Unicode's folding
		// (ſ is s, the Kelvin sign is k).
		folded := strings.NewReplacer("s", "ſ", "k", "\u212a").Replace(k)
		to := rapid.SampledFrom([]string{strings.ToUpper(k), folded}).Draw(t, "renamed")
		b = bytes.Replace(b, []byte(`"`+k+`":`), []byte(`"`+to+`":`), 1)
	case 6:
		k := rapid.SampledFrom(jsonFieldNames).Draw(t, "key")
		v := rapid.SampledFrom([]string{`null`, `"x"`, `1`, `-0`, `1e400`, `true`, `[]`, `{}`, `"2006-01-02T15:04:05Z"`,
			`"2006-01-02 15:04:05Z"`, `"1s"`, `"\ud800"`, `"12"`, `"::1"`, `{"::1":1}`}).Draw(t, "value")
		b = append([]byte(`{"`+k+`":`+v+`,`), b[1:]...)
	case 7:
		b = append([]byte(`{"unknown":{"a":[1,{"b":null}]},`), b[1:]...)
	case 8:
		k := rapid.SampledFrom(jsonFieldNames).Draw(t, "key")
		v := rapid.SampledFrom([]string{`null`, `"x"`, `1`, `true`, `[]`, `{}`, `"12"`}).Draw(t, "value")
		b = append(b[:len(b)-1], []byte(`,"`+k+`":`+v+`}`)...)
	}
	return b
}

// TestGenJSONDecode checks the default codec's decoder against
// encoding/json, the oracle: on generated values encoded by encoding/json,
// intact or corrupted, JSON{}.Unmarshal decodes whatever encoding/json
// decodes, to the same value, and never writes to its input (a hit's input
// is the reply's memory). Input encoding/json rejects, it may read (see
// JSON): how often is logged.
func TestGenJSONDecode(t *testing.T) {
	var lenient atomic.Int64
	defer func() { t.Logf("inputs encoding/json rejects that JSON{} read: %d", lenient.Load()) }()
	gen.Check(t, 3000, func(t *rapid.T) {
		if rapid.Bool().Draw(t, "timed") {
			checkJSONDecode[jsonTimed](t, genJSONTimed(t), &lenient)
		} else {
			checkJSONDecode[jsonDoc](t, genJSONDoc(t), &lenient)
		}
	})
}

func checkJSONDecode[T any](t *rapid.T, v T, lenient *atomic.Int64) {
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encoding/json: %v", err)
	}
	data = corruptJSON(t, data)
	in := bytes.Clone(data)
	var got, want T
	gerr := cacheguard.JSON{}.Unmarshal(data, &got)
	werr := json.Unmarshal(in, &want)
	if !bytes.Equal(data, in) {
		t.Fatalf("Unmarshal modified its input:\n%q\nwas\n%q", data, in)
	}
	if werr == nil && gerr != nil {
		t.Fatalf("on %s\nJSON{}.Unmarshal: %v\nencoding/json:    %v", in, gerr, werr)
	}
	if werr != nil {
		// Input encoding/json rejects, which no Guard writes: the fast
		// decoder may read some of it (see JSON).
		if gerr == nil {
			lenient.Add(1)
		}
		return
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("on %s\nJSON{}.Unmarshal: %#v\nencoding/json:    %#v", in, got, want)
	}
}
