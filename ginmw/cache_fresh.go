package ginmw

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// How old a response is and how long it stays fresh (RFC 9111 §4.2), read
// strictly: a field Cache cannot read exactly is the most conservative thing
// it may mean (an invalid Expires is in the past, an Age too large for 31
// bits is as good as infinity).

// responseDirectives returns the directives that decide what Cache may do
// with a response: those of CDN-Cache-Control when it is present and valid
// (RFC 9213: a cache that uses the targeted field ignores Cache-Control and
// Expires), else those of Cache-Control. targeted reports the former.
func responseDirectives(h http.Header) (d cacheControl, targeted bool) {
	if lines := h["Cdn-Cache-Control"]; len(lines) > 0 {
		if d, ok := parseTargeted(strings.Join(lines, ",")); ok {
			return d, true
		}
	}
	return parseCacheControl(h["Cache-Control"]), false
}

// freshnessLifetime is the response's explicit lifetime (RFC 9111 §4.2.1):
// s-maxage, max-age, or Expires minus Date (not with a targeted field); ok
// is false when it has none.
func freshnessLifetime(d cacheControl, targeted bool, h http.Header, now time.Time) (time.Duration, bool) {
	switch {
	case d.sMaxAge >= 0:
		return time.Duration(d.sMaxAge) * time.Second, true
	case d.maxAge >= 0:
		return time.Duration(d.maxAge) * time.Second, true
	case targeted || len(h["Expires"]) == 0:
		return 0, false
	}
	if len(h["Expires"]) != 1 {
		return 0, true // several Expires lines: invalid, in the past
	}
	exp, ok := parseHTTPDate(h["Expires"][0])
	if !ok {
		return 0, true
	}
	date := now
	if v := h["Date"]; len(v) == 1 {
		if t, ok := parseHTTPDate(v[0]); ok {
			date = t
		}
	}
	return max(exp.Sub(date), 0), true
}

// initialAge is the age of a response when Cache received it at now (RFC
// 9111 §4.2.3, corrected_initial_age): the larger of its Age and now minus
// its Date.
func initialAge(h http.Header, now time.Time) time.Duration {
	var age time.Duration
	if v := h["Age"]; len(v) > 0 {
		first, _, _ := strings.Cut(v[0], ",")
		if n, ok := deltaSeconds(strings.TrimSpace(first)); ok {
			age = time.Duration(n) * time.Second
		}
	}
	if v := h["Date"]; len(v) == 1 {
		if t, ok := parseHTTPDate(v[0]); ok && now.Sub(t) > age {
			age = now.Sub(t)
		}
	}
	return age
}

// deltaSeconds parses delta-seconds (RFC 9111 §1.2.2): digits only; a value
// past 2^31 is 2^31.
func deltaSeconds(s string) (int64, bool) {
	if s == "" {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > 1<<31 {
		n = 1 << 31
	}
	return n, true
}

// httpDateLayouts are the three forms of HTTP-date (RFC 9110 §5.6.7).
var httpDateLayouts = []string{http.TimeFormat, "Monday, 02-Jan-06 15:04:05 GMT", "Mon Jan _2 15:04:05 2006"}

// parseHTTPDate parses an HTTP-date exactly: time.Parse is lenient about
// case, digit counts and spacing, so the date must also format back to the
// same text — but for the day of the week, which may disagree with the date
// as long as it is a day's name.
func parseHTTPDate(s string) (time.Time, bool) {
	for _, layout := range httpDateLayouts {
		t, err := time.Parse(layout, s)
		if err != nil {
			continue
		}
		f := t.Format(layout)
		i, j := strings.IndexAny(s, ", "), strings.IndexAny(f, ", ")
		if i > 0 && j > 0 && s[i:] == f[j:] && titleCase(s[:i]) {
			return t, true
		}
	}
	return time.Time{}, false
}

// titleCase reports whether w is an upper-case letter followed by lower-case
// ones (time.Parse checked it is a day's name, in any case).
func titleCase(w string) bool {
	if w[0] < 'A' || w[0] > 'Z' {
		return false
	}
	for i := 1; i < len(w); i++ {
		if w[i] < 'a' || w[i] > 'z' {
			return false
		}
	}
	return true
}

// parseTargeted parses a CDN-Cache-Control field value: a Structured Field
// Dictionary (RFC 9213 §2.1, RFC 8941 §3.2). ok is false when it is not
// one, or a directive Cache acts on has a value of the wrong type: the field
// is then ignored as a whole.
func parseTargeted(s string) (cacheControl, bool) {
	d := cacheControl{maxAge: -1, sMaxAge: -1}
	s = strings.Trim(s, " \t")
	for s != "" {
		var key string
		if key, s = sfKey(s); key == "" {
			return d, false
		}
		isInt, n, flag := false, int64(0), true
		if strings.HasPrefix(s, "=") {
			var ok bool
			if isInt, n, flag, s, ok = sfBareItem(s[1:]); !ok {
				return d, false
			}
		}
		var ok bool
		if s, ok = sfParams(s); !ok {
			return d, false
		}
		switch key {
		case "max-age", "s-maxage":
			if !isInt || n < 0 {
				return d, false
			}
			if key == "max-age" {
				d.maxAge = min(n, 1<<31)
			} else {
				d.sMaxAge = min(n, 1<<31)
			}
		default:
			d.flag(key, flag)
		}
		s = strings.TrimLeft(s, " \t")
		if s == "" {
			break
		}
		if s[0] != ',' {
			return d, false
		}
		s = strings.TrimLeft(s[1:], " \t")
		if s == "" {
			return d, false // a trailing comma
		}
	}
	return d, true
}

// sfKey cuts a Structured Field key off s, or returns "".
func sfKey(s string) (key, rest string) {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] == '*') {
		return "", s
	}
	i := 1
	for i < len(s) && (s[i] >= 'a' && s[i] <= 'z' || s[i] >= '0' && s[i] <= '9' || strings.IndexByte("_-.*", s[i]) >= 0) {
		i++
	}
	return s[:i], s[i:]
}

// sfBareItem cuts a bare item off s: an integer (isInt, n), a boolean
// (flag), or a decimal, string, token or byte sequence (flag true).
func sfBareItem(s string) (isInt bool, n int64, flag bool, rest string, ok bool) {
	if s == "" {
		return false, 0, false, s, false
	}
	switch c := s[0]; {
	case c == '-' || c >= '0' && c <= '9':
		i := 0
		if c == '-' {
			i++
		}
		start := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		digits := i - start
		if digits == 0 {
			return false, 0, false, s, false
		}
		if i < len(s) && s[i] == '.' { // a decimal
			j := i + 1
			for j < len(s) && s[j] >= '0' && s[j] <= '9' {
				j++
			}
			if digits > 12 || j == i+1 || j-i-1 > 3 {
				return false, 0, false, s, false
			}
			return false, 0, true, s[j:], true
		}
		if digits > 15 {
			return false, 0, false, s, false
		}
		v, err := strconv.ParseInt(s[:i], 10, 64)
		return err == nil, v, true, s[i:], err == nil
	case c == '"':
		for i := 1; i < len(s); i++ {
			switch {
			case s[i] == '\\':
				if i+1 >= len(s) || (s[i+1] != '"' && s[i+1] != '\\') {
					return false, 0, false, s, false
				}
				i++
			case s[i] == '"':
				return false, 0, true, s[i+1:], true
			case s[i] < 0x20 || s[i] > 0x7e:
				return false, 0, false, s, false
			}
		}
		return false, 0, false, s, false
	case c == '?':
		if len(s) < 2 || (s[1] != '0' && s[1] != '1') {
			return false, 0, false, s, false
		}
		return false, 0, s[1] == '1', s[2:], true
	case c == ':':
		end := strings.IndexByte(s[1:], ':')
		if end < 0 {
			return false, 0, false, s, false
		}
		return false, 0, true, s[end+2:], true
	case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '*':
		i := 1
		for i < len(s) && (isTchar(s[i]) || s[i] == ':' || s[i] == '/') {
			i++
		}
		return false, 0, true, s[i:], true
	}
	return false, 0, false, s, false
}

// sfParams cuts the parameters (";" key ["=" bare item]) off s.
func sfParams(s string) (string, bool) {
	for strings.HasPrefix(s, ";") {
		var key string
		if key, s = sfKey(strings.TrimLeft(s[1:], " ")); key == "" {
			return s, false
		}
		if strings.HasPrefix(s, "=") {
			var ok bool
			if _, _, _, s, ok = sfBareItem(s[1:]); !ok {
				return s, false
			}
		}
	}
	return s, true
}

func isTchar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
