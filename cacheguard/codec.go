package cacheguard

import (
	"encoding/json"
	"reflect"
	"sync"
	"time"

	"github.com/segmentio/asm/cpu"
	"github.com/segmentio/asm/cpu/x86"
	fastjson "github.com/segmentio/encoding/json"
	"github.com/vmihailenco/msgpack/v5"
)

// Codec encodes values inside the stored envelope. Implementations must be
// safe for concurrent use; Unmarshal must return an error, not panic, on bytes
// it cannot read (a panic is recovered and counted as a decode error anyway),
// and must not modify data (it is the reply's memory, not a copy).
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSON is the default Codec: encoding/json's format and rules. It encodes
// with encoding/json, and decodes with github.com/segmentio/encoding/json, a
// reimplementation of encoding/json's decoder that, with its validation,
// reads the benchmarks' 300-byte record over three times as fast
// (BenchmarkCodecUnmarshal): on a warm hit the decode was a quarter of the
// client's CPU. Where its rules differ from encoding/json's, encoding/json
// decodes instead, into a zeroed value, and its result and error stand:
//
//   - input its validator rejects (its decoder alone accepts some malformed
//     input, such as the number 1-0), and input it then fails to decode;
//   - types that hold a time.Time or a time.Duration anywhere: it parses
//     times by its own rules, not time.Time's (another location, and
//     malformed times accepted), and durations from strings too.
//
// Input encoding/json rejects may still, rarely, be read (TestGenJSONDecode
// found a map[int]... key "1000 " with a space): no Guard writes such input,
// since encoding/json encodes every value, so only bytes damaged in Redis or
// written there by another program can be it. TestGenJSONDecode checks, on
// generated values and corrupted encodings of them, that it decodes all that
// encoding/json decodes, to the same value, and leaves its input unmodified.
// A Codec of your own that calls encoding/json keeps its rules exactly.
//
// Importing this package turns off segmentio/asm's AVX routines for the
// process (see init): segmentio's scalar code decodes the same, in a time
// that does not depend on the host's AVX→SSE transition cost.
type JSON struct{}

// init turns off, for the process, the AVX routines of segmentio/asm that
// JSON's decoder calls several times a decode (ascii.ValidPrint, keyset
// Lookup), as building with -tags purego would. They return with the upper
// halves of the YMM registers dirty (no VZEROUPPER), so the next legacy SSE
// instruction — Go's ABI wrappers and compiled code use them — pays an
// AVX→SSE transition; on both hosts measured (virtualised AMD EPYC: 0.3–0.4
// µs a call; Intel Xeon: 170–185 ns a transition) that cost more than the
// vector code saved, and a 29-byte value decoded 3–4× slower than with the
// scalar code (BenchmarkCodecUnmarshal). A program that wants them back for
// other users of segmentio/asm may set cpu.X86 = x86.ABI() after init.
func init() {
	cpu.X86 &^= x86.CPU(x86.AVX | x86.AVX2 | x86.AVX512F | x86.AVX512BW | x86.AVX512DQ | x86.AVX512VL | x86.AVX512CD)
}

// Marshal encodes v as JSON (encoding/json).
func (JSON) Marshal(v any) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes JSON data into v, a non-nil pointer, as encoding/json
// does (see JSON).
func (JSON) Unmarshal(data []byte, v any) error {
	if fastJSON(reflect.TypeOf(v)) && fastjson.Valid(data) && fastjson.Unmarshal(data, v) == nil {
		return nil
	}
	if p := reflect.ValueOf(v); p.Kind() == reflect.Pointer && !p.IsNil() {
		p.Elem().SetZero() // what the failed decode wrote is not kept
	}
	return json.Unmarshal(data, v)
}

// fastTypes caches fastJSON's answers, by type.
var fastTypes sync.Map // reflect.Type → bool

// fastJSON reports whether values of t may be decoded by
// segmentio/encoding/json (see JSON): t holds no time.Time or time.Duration,
// through pointers, slices, arrays, maps and struct fields.
func fastJSON(t reflect.Type) bool {
	if ok, found := fastTypes.Load(t); found {
		return ok.(bool)
	}
	ok := !holdsTime(t, map[reflect.Type]bool{})
	fastTypes.Store(t, ok)
	return ok
}

func holdsTime(t reflect.Type, seen map[reflect.Type]bool) bool {
	if t == nil || seen[t] {
		return false
	}
	seen[t] = true
	switch t {
	case reflect.TypeFor[time.Time](), reflect.TypeFor[time.Duration]():
		return true
	}
	switch t.Kind() {
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return holdsTime(t.Elem(), seen)
	case reflect.Map:
		return holdsTime(t.Key(), seen) || holdsTime(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if holdsTime(t.Field(i).Type, seen) {
				return true
			}
		}
	}
	return false
}

// MsgPack is a Codec that encodes values as MessagePack
// (github.com/vmihailenco/msgpack/v5, go-redis/cache's codec): about 12%
// fewer bytes than JSON for the benchmarks' record, decoded in about the
// time JSON takes (BenchmarkCodecUnmarshal); []byte is stored as bytes, not
// base64. Fields are named by their `msgpack` tags,
// else by their Go names (not by `json` tags). Opt in with
// Encoding(MsgPack{}) on every Guard that shares the keys.
type MsgPack struct{}

// Marshal encodes v as MessagePack.
func (MsgPack) Marshal(v any) ([]byte, error) { return msgpack.Marshal(v) }

// Unmarshal decodes MessagePack data into v; it copies what it keeps.
func (MsgPack) Unmarshal(data []byte, v any) error { return msgpack.Unmarshal(data, v) }
