package cacheguard

import "unicode/utf8"

// maxPlainDepth is how deeply plainJSON lets arrays and objects nest.
const maxPlainDepth = 64

// plainJSON reports whether b is plain JSON: one value in the syntax of
// RFC 8259 (what encoding/json.Valid accepts), whose strings are valid UTF-8
// and escape no surrogate (\ud800–\udfff), nested at most maxPlainDepth
// deep. Every value encoding/json encodes that nests no deeper is plain: it
// writes valid UTF-8 and never escapes a surrogate. The JSON codec decodes
// plain input with segmentio/encoding/json and anything else with
// encoding/json, whose rules decide; so plainJSON may refuse what is valid,
// never accept what is not (TestGenPlainJSON checks it against
// encoding/json.Valid).
//
// It scans b once, a byte at a time, and allocates nothing: what it costs is
// proportional to len(b) on any host. It replaces segmentio's json.Valid,
// which runs that decoder's parser after an ASCII scan whose AVX2 path
// (16 bytes or more) cost a fixed 0.3–0.4 µs a call on the AMD EPYC host of
// 2026-11-30 (the decoder runs that scan once more). There, on the
// benchmarks' 258-byte record, this check took 0.27–0.50 µs against
// segmentio's 0.52–0.74 (6 interleaved runs), and BenchmarkCodecUnmarshal's
// decode of a 29-byte Repo fell from 1.21–1.24 to 0.92–1.05 µs.
func plainJSON(b []byte) bool {
	var stack [maxPlainDepth]byte // '}' or ']': what closes each open container
	depth := 0
	i := skipSpace(b, 0)
	for {
		// A value begins at i.
		if i >= len(b) {
			return false
		}
		switch c := b[i]; c {
		case '{', '[':
			if depth == maxPlainDepth {
				return false
			}
			closer := byte('}')
			if c == '[' {
				closer = ']'
			}
			i = skipSpace(b, i+1)
			if i < len(b) && b[i] == closer {
				i++
				break // empty: the value ends here
			}
			stack[depth] = closer
			depth++
			if closer == '}' {
				if i = member(b, i); i < 0 {
					return false
				}
			}
			continue // the first element's value
		case '"':
			i = plainString(b, i)
		case 't':
			i = literal(b, i, "true")
		case 'f':
			i = literal(b, i, "false")
		case 'n':
			i = literal(b, i, "null")
		default:
			i = number(b, i)
		}
		if i < 0 {
			return false
		}
		// A value ended at i: what follows closes containers, or separates
		// the next element.
		for {
			i = skipSpace(b, i)
			if depth == 0 {
				return i == len(b)
			}
			if i >= len(b) {
				return false
			}
			if b[i] == stack[depth-1] {
				depth--
				i++
				continue
			}
			if b[i] != ',' {
				return false
			}
			i = skipSpace(b, i+1)
			if stack[depth-1] == '}' {
				if i = member(b, i); i < 0 {
					return false
				}
			}
			break
		}
	}
}

// member scans an object member's name and colon at i, and the space after
// them: the index of its value, or -1.
func member(b []byte, i int) int {
	if i >= len(b) || b[i] != '"' {
		return -1
	}
	if i = plainString(b, i); i < 0 {
		return -1
	}
	i = skipSpace(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return skipSpace(b, i+1)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// plainString scans the string whose quote is at i: the index after its
// closing quote, or -1 when it is not plain (see plainJSON).
func plainString(b []byte, i int) int {
	i++
	for i < len(b) {
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			return i + 1
		case c == '\\':
			if i+1 >= len(b) {
				return -1
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return -1
				}
				r := rune(0)
				for _, h := range b[i+2 : i+6] {
					switch {
					case '0' <= h && h <= '9':
						h -= '0'
					case 'a' <= h && h <= 'f':
						h -= 'a' - 10
					case 'A' <= h && h <= 'F':
						h -= 'A' - 10
					default:
						return -1
					}
					r = r<<4 | rune(h)
				}
				if 0xd800 <= r && r <= 0xdfff {
					return -1 // a surrogate: decoders differ on lone ones
				}
				i += 6
			default:
				return -1
			}
		case c < 0x20:
			return -1
		default: // a byte of a multi-byte rune
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n == 1 {
				return -1
			}
			i += n
		}
	}
	return -1
}

// literal scans the literal word at i: the index after it, or -1.
func literal(b []byte, i int, word string) int {
	if len(b)-i < len(word) || string(b[i:i+len(word)]) != word {
		return -1
	}
	return i + len(word)
}

// number scans the number at i (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?):
// the index after it, or -1.
func number(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i)
	default:
		return -1
	}
	if i < len(b) && b[i] == '.' {
		if i+1 >= len(b) || b[i+1] < '0' || b[i+1] > '9' {
			return -1
		}
		i = digits(b, i+1)
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			return -1
		}
		i = digits(b, i)
	}
	return i
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// plainByte marks the bytes a string holds as they are: printable ASCII but
// the quote and the backslash.
var plainByte = func() (t [256]bool) {
	for c := ' '; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()
