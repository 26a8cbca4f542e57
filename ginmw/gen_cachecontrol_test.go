package ginmw

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/internal/testing/gen"
)

// TestGenCacheControl draws response Cache-Control fields from a grammar —
// the directives decide acts on and unknown ones, in mixed case, repeated,
// with token and quoted-string arguments (commas, escapes), the separators
// a sender gets right and wrong (",", ", ", ";", tabs, none), whitespace
// around "=", and bytes that belong nowhere — and checks what decide allows
// for a 200 against refCacheControl, a model written from RFC 9110 §5.6 and
// RFC 9111 §5.2 and the package documentation, which shares no code with
// the parser: a field that does not parse, or holds no-store, private or
// no-cache, is neither stored nor shared; else s-maxage, or max-age, the
// smallest of each when repeated, an invalid value read as 0, caps the
// lifetime, and a lifetime of 0 is stale on arrival (neither stored nor
// shared); without either the response is stored for the route's TTL.
func TestGenCacheControl(t *testing.T) {
	m := &cacheMW{cfg: cacheConfig{maxBody: defaultMaxBody, maxSharedBody: defaultMaxSharedBody}, ttl: time.Minute}
	req := httptestRequest()
	gen.Check(t, 30000, func(rt *rapid.T) {
		lines := rapid.SliceOfN(genCCLine(), 1, 2).Draw(rt, "lines")
		want := refCacheControl(lines)
		v := m.decide(req, &response{status: http.StatusOK, header: http.Header{"Cache-Control": lines}})
		if v.store != want.store || v.share != want.share {
			rt.Fatalf("Cache-Control %q: decide store=%v share=%v (%s); the model says store=%v share=%v (%s)",
				lines, v.store, v.share, v.why, want.store, want.share, want.why)
		}
		if v.store && v.ttl != want.ttl {
			rt.Fatalf("Cache-Control %q: decide's lifetime %v, the model's %v", lines, v.ttl, want.ttl)
		}
	})
}

func httptestRequest() *http.Request {
	req, err := http.NewRequest(http.MethodGet, "http://example.com/x", nil)
	if err != nil {
		panic(err)
	}
	return req
}

// genCCLine draws one Cache-Control field line.
func genCCLine() *rapid.Generator[string] {
	return rapid.Custom(func(rt *rapid.T) string {
		var b strings.Builder
		if rapid.IntRange(0, 5).Draw(rt, "lead") == 0 {
			b.WriteString(rapid.SampledFrom([]string{" ", "\t", ",", " , "}).Draw(rt, "leading"))
		}
		n := rapid.IntRange(0, 4).Draw(rt, "elements")
		for i := range n {
			if i > 0 {
				sep := rapid.SampledFrom([]string{",", ", ", " ,", ",\t", "\t,\t", ",,", ", ,"})
				if rapid.IntRange(0, 7).Draw(rt, "wrong separator") == 0 {
					sep = rapid.SampledFrom([]string{";", "; ", " ", ""})
				}
				b.WriteString(sep.Draw(rt, "separator"))
			}
			b.WriteString(genCCElement(rt))
		}
		if rapid.IntRange(0, 5).Draw(rt, "trail") == 0 {
			b.WriteString(rapid.SampledFrom([]string{" ", "\t", ",", ";", ", "}).Draw(rt, "trailing"))
		}
		return b.String()
	})
}

var (
	ccNames = []string{"no-store", "private", "no-cache", "public", "must-revalidate", "proxy-revalidate",
		"max-age", "max-age", "max-age", "s-maxage", "s-maxage", "immutable", "no-transform",
		"stale-while-revalidate", "x-ext", "maxage", "no-stor"}
	ccTokens = []string{"0", "1", "60", "007", "3600", "86400", "2147483647", "2147483648", "99999999999999999999",
		"30", "5", "120", "-1", "+5", "1.5", "60s", "abc", "Set-Cookie", "x", "1e3"}
	ccQuoted = []string{"60", "0", "6\\0", "Set-Cookie", "Set-Cookie, X-Foo", "a,b", " ", "", "\\\"", "\\\\",
		"no-store", ";", "=", "\t", "caf\xc3\xa9", "\\\x01"}
	ccGarbage = []string{";", "\"", "=", "\\", "\v", "\r", "\x00", "\x7f", "\xa0", "\xc2\xa0", "(", ")", "/", "{",
		"@", "[", "?", "\x01", "é", "no-store;", "max-age==1", "max-age=\"1", "=60", "\"no-store\""}
)

// genCCElement draws one element: a directive, maybe with an argument, or
// something that is none.
func genCCElement(rt *rapid.T) string {
	switch rapid.IntRange(0, 15).Draw(rt, "kind") {
	case 0:
		return "" // an empty list element
	case 1:
		return rapid.SampledFrom(ccGarbage).Draw(rt, "garbage")
	case 2:
		// Garbage inside or around a directive.
		d := genCCDirective(rt)
		g := rapid.SampledFrom(ccGarbage).Draw(rt, "garbage")
		at := rapid.IntRange(0, len(d)).Draw(rt, "at")
		return d[:at] + g + d[at:]
	default:
		return genCCDirective(rt)
	}
}

func genCCDirective(rt *rapid.T) string {
	name := mixCase(rt, rapid.SampledFrom(ccNames).Draw(rt, "name"))
	switch rapid.IntRange(0, 3).Draw(rt, "argument") {
	case 0:
		return name
	case 1, 2:
		eq := "="
		if rapid.IntRange(0, 11).Draw(rt, "spaced") == 0 {
			eq = rapid.SampledFrom([]string{" =", "= ", " = ", "\t="}).Draw(rt, "eq")
		}
		return name + eq + rapid.SampledFrom(ccTokens).Draw(rt, "token")
	default:
		q := `"` + rapid.SampledFrom(ccQuoted).Draw(rt, "quoted")
		if rapid.IntRange(0, 9).Draw(rt, "unterminated") > 0 {
			q += `"`
		}
		return name + "=" + q
	}
}

// mixCase changes the case of some of s's letters.
func mixCase(rt *rapid.T, s string) string {
	if rapid.IntRange(0, 2).Draw(rt, "mixed") > 0 {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if c >= 'a' && c <= 'z' && rapid.Bool().Draw(rt, "upper") {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// refVerdict is what the model allows.
type refVerdict struct {
	store, share bool
	ttl          time.Duration
	why          string
}

// refCacheControl is the model: what a shared cache may do with a 200
// response to a request without Authorization, with these Cache-Control
// field lines and no other field that matters (no Age, Date, Expires, Vary,
// Set-Cookie). Each line is parsed on its own (a quoted string never spans
// two lines).
func refCacheControl(lines []string) refVerdict {
	maxAge, sMaxAge := int64(-1), int64(-1)
	for _, line := range lines {
		dirs, ok := refParseLine(line)
		if !ok {
			return refVerdict{why: "does not parse"}
		}
		for _, d := range dirs {
			switch d.name {
			case "no-store", "private", "no-cache": // §5.2.2.5, §5.2.2.7, §5.2.2.4: any argument
				return refVerdict{why: d.name}
			case "max-age":
				maxAge = refSmaller(maxAge, refDelta(d))
			case "s-maxage":
				sMaxAge = refSmaller(sMaxAge, refDelta(d))
			}
		}
	}
	lifetime := sMaxAge // §4.2.1: s-maxage first, in a shared cache
	if lifetime < 0 {
		lifetime = maxAge
	}
	switch {
	case lifetime == 0:
		return refVerdict{why: "stale on arrival"}
	case lifetime > 0:
		return refVerdict{store: true, share: true, ttl: time.Duration(lifetime) * time.Second}
	}
	return refVerdict{store: true, share: true} // no explicit freshness: the route's TTL
}

type refDirective struct {
	name   string // lower case
	arg    string // unquoted
	hasArg bool
}

// refDelta reads a directive's delta-seconds (RFC 9111 §1.2.2; either form
// of the argument, §5.2): digits only, past 2^31 as 2^31; anything else, and
// no argument, is invalid and counts as 0 (§4.2.1).
func refDelta(d refDirective) int64 {
	if !d.hasArg || d.arg == "" {
		return 0
	}
	var n int64
	for i := 0; i < len(d.arg); i++ {
		c := d.arg[i]
		if c < '0' || c > '9' {
			return 0
		}
		if n < 1<<31 {
			n = n*10 + int64(c-'0')
		}
	}
	return min(n, 1<<31)
}

func refSmaller(prev, n int64) int64 {
	if prev < 0 || n < prev {
		return n
	}
	return prev
}

// refParseLine parses a field line as a list of cache-directive (RFC 9110
// §5.6.1: elements separated by OWS "," OWS, empty ones allowed; RFC 9111
// §5.2: token [ "=" ( token / quoted-string ) ], no whitespace around "=").
func refParseLine(line string) ([]refDirective, bool) {
	var dirs []refDirective
	i, n := 0, len(line)
	for {
		for i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == ',') {
			i++
		}
		if i == n {
			return dirs, true
		}
		j := i
		for j < n && refTchar(line[j]) {
			j++
		}
		if j == i {
			return nil, false
		}
		d := refDirective{name: strings.ToLower(line[i:j])}
		i = j
		if i < n && line[i] == '=' {
			i++
			d.hasArg = true
			if i < n && line[i] == '"' {
				arg, end, ok := refQuoted(line, i)
				if !ok {
					return nil, false
				}
				d.arg, i = arg, end
			} else {
				j := i
				for j < n && refTchar(line[j]) {
					j++
				}
				if j == i {
					return nil, false
				}
				d.arg, i = line[i:j], j
			}
		}
		for i < n && (line[i] == ' ' || line[i] == '\t') {
			i++
		}
		if i < n && line[i] != ',' {
			return nil, false
		}
		dirs = append(dirs, d)
	}
}

// refQuoted reads the quoted-string at line[i] (RFC 9110 §5.6.4): its
// content with quoted-pairs resolved, and where it ends.
func refQuoted(line string, i int) (string, int, bool) {
	var b strings.Builder
	for i++; i < len(line); i++ {
		c := line[i]
		switch {
		case c == '"':
			return b.String(), i + 1, true
		case c == '\\':
			if i+1 == len(line) {
				return "", 0, false
			}
			i++
			if e := line[i]; e != '\t' && e != ' ' && (e < 0x21 || e == 0x7f) {
				return "", 0, false // quoted-pair = "\" ( HTAB / SP / VCHAR / obs-text )
			}
			b.WriteByte(line[i])
		case c == '\t' || c == ' ' || c == 0x21 || c >= 0x23 && c <= 0x5b || c >= 0x5d && c <= 0x7e || c >= 0x80:
			b.WriteByte(c) // qdtext
		default:
			return "", 0, false
		}
	}
	return "", 0, false
}

// refTchar: RFC 9110 §5.6.2.
func refTchar(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// The model's named cases, so that a mistake in it shows here first.
func TestRefCacheControlModel(t *testing.T) {
	for _, tc := range []struct {
		lines []string
		want  string
	}{
		{[]string{"max-age=60"}, "store 1m0s"},
		{[]string{"MAX-AGE=60, s-maxage=30"}, "store 30s"},
		{[]string{`max-age="6\0"`}, "store 1m0s"},
		{[]string{"max-age=60, max-age=5"}, "store 5s"},
		{[]string{"max-age=abc"}, "stale on arrival"},
		{[]string{"max-age"}, "stale on arrival"},
		{[]string{"max-age=99999999999999999999"}, fmt.Sprint("store ", time.Duration(1<<31)*time.Second)},
		{[]string{"no-store;"}, "does not parse"},
		{[]string{"private; max-age=60"}, "does not parse"},
		{[]string{"max-age = 60"}, "does not parse"},
		{[]string{"max-age=60\v"}, "does not parse"},
		{[]string{`x="a\`}, "does not parse"},
		{[]string{`no-cache="Set-Cookie, X-Foo", max-age=60`}, "no-cache"},
		{[]string{"Private"}, "private"},
		{[]string{"", " , ,"}, "store"},
		{[]string{`x="a`, `b", max-age=60`}, "does not parse"},
		{[]string{"public, must-revalidate"}, "store"},
	} {
		v := refCacheControl(tc.lines)
		got := v.why
		if v.store {
			got = "store"
			if v.ttl > 0 {
				got += " " + v.ttl.String()
			}
		}
		if got != tc.want {
			t.Errorf("%q: model says %q, want %q", tc.lines, got, tc.want)
		}
	}
}

// What TestGenCacheControl found in the parser before it, as named cases:
// decide must agree with the model on each.
func TestCacheControlGrammarRegressions(t *testing.T) {
	m := &cacheMW{cfg: cacheConfig{maxBody: defaultMaxBody, maxSharedBody: defaultMaxSharedBody}, ttl: time.Minute}
	req := httptestRequest()
	for _, tc := range []struct {
		value string
		store bool
	}{
		{" ", true},                           // an empty field was malformed
		{"max-age=60, ", true},                // so was a trailing comma and space
		{"max-age = 60", false},               // whitespace around "=" was accepted
		{"max-age=60\v", false},               // a trailing control character was trimmed away
		{"max-age=60, x=\"\x01\"", false},     // a control character in a quoted string was accepted
		{`max-age="6\0"`, true},               // a quoted pair was not resolved: 60, not 0
		{"max-age=2147483648no-store", false}, // an invalid value was read as 2^31, not 0
		{`max-age="\"60\""`, false},           // quotes inside the quoted string were dropped
	} {
		v := m.decide(req, &response{status: http.StatusOK, header: http.Header{"Cache-Control": {tc.value}}})
		want := refCacheControl([]string{tc.value})
		if v.store != tc.store || want.store != tc.store {
			t.Errorf("Cache-Control %q: decide stores %v (%s), the model %v (%s); want %v", tc.value, v.store, v.why, want.store, want.why, tc.store)
		}
	}
}
