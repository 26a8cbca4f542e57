package ginmw

import (
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// What Cache may do with a request and with a response, after RFC 9111's
// rules for a shared cache. Every path that looks a request up (Cache's own
// requests and BackgroundRefresh's copies) asks bypass, and every response a
// handler produced for Cache (a load for the requests of every process, a
// background refresh) goes through decide: nothing is stored, or handed to
// another request, that decide did not allow.

// bypass returns why req must not be answered from the cache, or "": its
// handler then runs for it alone and nothing is stored.
func (m *cacheMW) bypass(req *http.Request) string {
	if u := req.URL; u.RawPath != "" && u.EscapedPath() != u.RawPath {
		// The target spells its path in a way no escaped path does (a raw
		// "#", say): its key, the escaped path, names another spelling than
		// the one Gin routes on under UseRawPath, so that targets Gin routes
		// apart would share an entry. No key names it: its handler runs.
		return "path not validly escaped"
	}
	if req.Header.Get("Range") != "" {
		return "range" // partial content is not cached
	}
	cc, ok := req.Header["Cache-Control"]
	if ok {
		d := parseCacheControl(cc)
		if d.malformed {
			return "malformed Cache-Control"
		}
		if d.noStore {
			return "no-store" // RFC 9111 §5.2.1.5: nothing of a response to it may be stored
		}
		if m.cfg.requestNoCache && (d.noCache || d.maxAge == 0) {
			return "no-cache"
		}
	} else if m.cfg.requestNoCache && headerHasToken(req.Header, "Pragma", "No-Cache") {
		return "no-cache" // RFC 9111 §5.4: Pragma counts only without Cache-Control
	}
	return ""
}

// verdict is what decide allows for one response.
type verdict struct {
	// share: the response may answer another request than the one whose
	// handler produced it — the requests of this process that waited for the
	// same load and, when stored, every later one.
	share bool
	store bool          // share, and Cache stores it
	ttl   time.Duration // what is left of its explicit lifetime, whole seconds; 0 when it has none
	age   time.Duration // its age when received (RFC 9111 §4.2.3)
	// strict: it must not be served once its lifetime or the TTL ends
	// (must-revalidate, proxy-revalidate, s-maxage), even under ServeStale or
	// FailSafe.
	strict bool
	why    string // why it is not stored, when it is not
}

// decide is the one place that says what may be done with a response r that
// the handler produced for req (the request as it reached Cache), read from
// CDN-Cache-Control when it is valid, else Cache-Control and Expires:
//
//   - never shared nor stored: a response that may not answer another user —
//     no-store, a malformed Cache-Control (read as no-store), private, no-cache (RFC 9111 §5.2.2.2-5.2.2.7: qualified forms
//     included), Set-Cookie, Vary: * or a Vary on a header Cache does not key
//     by (VaryByHeader), an answer to a request with Authorization without
//     public, s-maxage or must-revalidate (§3.5) unless Authorization is a
//     VaryByHeader header, one stale on arrival (its Age or Date past its
//     explicit lifetime, max-age=0, an invalid Expires), a 206 or 304, a
//     streamed or hijacked response;
//   - shared with the requests that waited for it but not stored: any other
//     status than 2xx, a 2xx other than 200, 203 and 204 without explicit
//     freshness or public (§4.2.2: no heuristic lifetime for it), and a body
//     larger than MaxBody;
//   - stored otherwise, for the TTL or what is left of its own lifetime if
//     that is shorter.
func (m *cacheMW) decide(req *http.Request, r *response) verdict {
	if r == nil {
		return verdict{why: "streamed"}
	}
	h := r.header
	d, targeted := responseDirectives(h)
	switch {
	case r.status == http.StatusPartialContent || r.status == http.StatusNotModified:
		return verdict{why: "status " + strconv.Itoa(r.status)}
	case d.malformed:
		return verdict{why: "malformed Cache-Control"}
	case d.noStore:
		return verdict{why: "no-store"}
	case d.private:
		return verdict{why: "private"}
	case d.noCache:
		return verdict{why: "no-cache"}
	case len(h["Set-Cookie"]) > 0:
		return verdict{why: "Set-Cookie"}
	}
	if v := m.unkeyedVary(h); v != "" {
		return verdict{why: "Vary: " + v}
	}
	if req.Header.Get("Authorization") != "" && !d.public && d.sMaxAge < 0 && !d.mustRevalidate &&
		!slices.Contains(m.cfg.vary, "Authorization") {
		return verdict{why: "Authorization without public, s-maxage or must-revalidate"}
	}
	now := time.Now()
	v := verdict{share: true, strict: d.mustRevalidate || d.proxyRevalidate || d.sMaxAge >= 0, age: initialAge(h, now)}
	lifetime, explicit := freshnessLifetime(d, targeted, h, now)
	if explicit {
		v.ttl = (lifetime - v.age).Truncate(time.Second)
		if v.ttl <= 0 {
			return verdict{why: "stale on arrival"}
		}
	}
	switch {
	case r.status < 200 || r.status > 299:
		v.why = "status " + strconv.Itoa(r.status)
	case !explicit && !d.public && r.status != http.StatusOK && r.status != http.StatusNonAuthoritativeInfo && r.status != http.StatusNoContent:
		v.why = "status " + strconv.Itoa(r.status) + " without explicit freshness"
	case r.oversize:
		v.why = fmt.Sprintf("body over MaxBody (%d bytes)", m.cfg.maxBody)
	default:
		v.store = true
	}
	return v
}

// unkeyedVary returns the first header named by the response's Vary that
// Cache does not key by ("*" included), or "".
func (m *cacheMW) unkeyedVary(h http.Header) string {
	for _, line := range h["Vary"] {
		for t := range strings.SplitSeq(line, ",") {
			t = strings.TrimSpace(t)
			if t == "" {
				continue
			}
			if t == "*" || !slices.Contains(m.cfg.vary, http.CanonicalHeaderKey(t)) {
				return t
			}
		}
	}
	return ""
}

// cacheControl holds the Cache-Control directives Cache acts on. maxAge and
// sMaxAge are -1 when absent; an invalid value counts as 0 (stale at once,
// RFC 9111 §4.2.1), and of several the smallest. malformed: a directive is
// not a token, =, token or quoted string (e.g. "no-store;" or "private;
// max-age=60"): what its sender meant cannot be told, so it is read as
// no-store (nginx and Varnish find no-store and private anywhere in the
// field; Cache refuses the field as a whole).
type cacheControl struct {
	noStore, noCache, private, public, mustRevalidate, proxyRevalidate bool
	malformed                                                          bool
	maxAge, sMaxAge                                                    int64
}

// parseCacheControl parses Cache-Control field lines (RFC 9111 §5.2), each
// on its own: comma-separated directives, names case-insensitive, arguments
// a token or a quoted string (which may hold commas).
func parseCacheControl(lines []string) cacheControl {
	d := cacheControl{maxAge: -1, sMaxAge: -1}
	for _, line := range lines {
		for {
			name, arg, rest, ok := nextDirective(line)
			if !ok {
				d.malformed, d.noStore = true, true
				return d
			}
			if name == "" {
				break
			}
			switch name = strings.ToLower(name); name {
			case "max-age":
				d.maxAge = seconds(d.maxAge, arg)
			case "s-maxage":
				d.sMaxAge = seconds(d.sMaxAge, arg)
			default:
				d.flag(name, true)
			}
			line = rest
		}
	}
	return d
}

// flag sets the boolean directive name (lower case) to on; other names are
// ignored. Cache-Control and CDN-Cache-Control share it.
func (d *cacheControl) flag(name string, on bool) {
	switch name {
	case "no-store":
		d.noStore = on
	case "no-cache":
		d.noCache = on
	case "private":
		d.private = on
	case "public":
		d.public = on
	case "must-revalidate":
		d.mustRevalidate = on
	case "proxy-revalidate":
		d.proxyRevalidate = on
	}
}

// nextDirective cuts the first directive off s, the rest of a field line: a
// list whose elements are separated by commas with optional spaces and
// tabs, empty ones allowed (RFC 9110 §5.6.1), each a token, optionally
// followed by "=" and a token or a quoted string, with no whitespace around
// "=" (RFC 9111 §5.2). name is "" when s holds no more directives; ok is
// false when the next one does not parse. A quoted argument is returned
// without its quotes and escapes.
func nextDirective(s string) (name, arg, rest string, ok bool) {
	s = strings.TrimLeft(s, " \t,")
	if s == "" {
		return "", "", "", true
	}
	n := tokenLen(s)
	if n == 0 {
		return "", "", "", false
	}
	name, s = s[:n], s[n:]
	if strings.HasPrefix(s, "=") {
		s = s[1:]
		if strings.HasPrefix(s, `"`) {
			if arg, s, ok = quotedString(s); !ok {
				return "", "", "", false
			}
		} else {
			if n = tokenLen(s); n == 0 {
				return "", "", "", false
			}
			arg, s = s[:n], s[n:]
		}
	}
	s = strings.TrimLeft(s, " \t")
	if s != "" && s[0] != ',' {
		return "", "", "", false
	}
	return name, arg, s, true
}

// quotedString cuts the quoted string (RFC 9110 §5.6.4) at the start of s
// off it, and returns its content with the quoted pairs resolved; ok is
// false when it is not one (unterminated, or holding a control character).
func quotedString(s string) (content, rest string, ok bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"':
			return b.String(), s[i+1:], true
		case c == '\\' && i+1 < len(s) && textByte(s[i+1]):
			i++
			b.WriteByte(s[i])
		case c != '\\' && textByte(c):
			b.WriteByte(c)
		default:
			return "", "", false
		}
	}
	return "", "", false
}

// textByte reports whether c may appear in a quoted string: HTAB, SP, a
// visible character or obs-text (a '"' or '\' only escaped).
func textByte(c byte) bool {
	return c == '\t' || c >= ' ' && c != 0x7f
}

// tokenLen returns the length of the token s starts with (0 if none).
func tokenLen(s string) int {
	i := 0
	for i < len(s) && isTchar(s[i]) {
		i++
	}
	return i
}

// isToken reports whether s is an HTTP token (RFC 9110 §5.6.2).
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// seconds combines a delta-seconds argument with the value seen so far: an
// invalid one counts as 0 (RFC 9111 §4.2.1), one past 2^31 as 2^31
// (deltaSeconds, Age's parser too).
func seconds(prev int64, arg string) int64 {
	n, ok := deltaSeconds(arg)
	if !ok {
		n = 0
	}
	if prev >= 0 {
		return min(prev, n)
	}
	return n
}
