package ginmw

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/locks"
)

// MaxKeyLen bounds the value a Key extracts, in bytes; a longer value is a
// bad key (400). It keeps lock names and cache keys far below Redis limits and
// below locks.MaxNameLen once scoped.
const MaxKeyLen = 256

// maxScopedLen bounds a name a Key makes: a lock name and a cache key.
const maxScopedLen = min(locks.MaxNameLen, cacheguard.MaxKeyLen)

// Key says which resource a request names: a path parameter (Param), a
// header (Header), a query value (Query) or anything a function computes
// (Func), optionally brought to a canonical form that is also checked (Int,
// UUID, Check), scoped either to a resource kind (Resource) or, by default,
// to the route's full path. It runs before any Redis call. The zero Key
// is invalid.
//
// Param, Header and Query take the value as the client wrote it: "/repos/01"
// and "/repos/1" are two names, and any string up to MaxKeyLen is one. Wrap
// them in Int or UUID (or Check) wherever the value names a row, so that every
// spelling of an id takes the same lock and cache entry, and a value that
// cannot name a row is refused without touching Redis.
type Key struct {
	kind  string // resource kind; "" scopes the key to the route's full path
	param string // the path parameter the value comes from, if it does
	fn    func(c *gin.Context) (string, error)
}

// Param extracts the path parameter name (as in "/repos/:id"). It panics
// with a "ginmw:" message when name is empty.
func Param(name string) Key {
	if name == "" {
		panic("ginmw: Param called with an empty name")
	}
	return Key{param: name, fn: func(c *gin.Context) (string, error) {
		if v := c.Param(name); v != "" {
			return v, nil
		}
		return "", &keyError{msg: fmt.Sprintf("path parameter %q is missing", name)}
	}}
}

// Header extracts the value of the request header name. It panics with a
// "ginmw:" message when name is not a header name (an HTTP token).
func Header(name string) Key {
	if !isToken(name) {
		panic(fmt.Sprintf("ginmw: Header called with %q, which is not a header name", name))
	}
	return Key{fn: func(c *gin.Context) (string, error) {
		if v := c.GetHeader(name); v != "" {
			return v, nil
		}
		return "", &keyError{msg: fmt.Sprintf("header %q is missing", name)}
	}}
}

// Query extracts the value of the URL query parameter name. It panics with
// a "ginmw:" message when name is empty.
func Query(name string) Key {
	if name == "" {
		panic("ginmw: Query called with an empty name")
	}
	return Key{fn: func(c *gin.Context) (string, error) {
		if v := c.Query(name); v != "" {
			return v, nil
		}
		return "", &keyError{msg: fmt.Sprintf("query parameter %q is missing", name)}
	}}
}

// Func extracts a key with f. An error from f refuses the request with 400
// (404 when it matches ErrNotFound) and the error's text in the JSON body, so
// it should be fit for the client's eyes.
// f runs on the request's goroutine before the handler.
func Func(f func(c *gin.Context) (string, error)) Key {
	if f == nil {
		panic("ginmw: Func called with a nil function")
	}
	return Key{fn: f}
}

// Resource scopes key to a resource kind: Resource("repos", Param("id")) names
// "repos:<id>", the name gormplugin uses for the row of table repos with that
// primary key, so every route and every GORM write on the row shares one lock.
// It panics with a "ginmw:" message when kind is empty, or so long that a
// value of MaxKeyLen bytes after it would not make a lock name or a cache key.
func Resource(kind string, key Key) Key {
	switch {
	case kind == "":
		panic("ginmw: Resource called with an empty kind")
	case key.fn == nil:
		panic("ginmw: Resource called with a zero Key")
	case len(kind)+1+MaxKeyLen > maxScopedLen:
		// Some of the names it makes would be refused (kind, ':' and a
		// value of up to MaxKeyLen), each such request with a 400.
		panic(fmt.Sprintf("ginmw: Resource called with a kind of %d bytes: names of up to %d bytes after it would exceed %d",
			len(kind), MaxKeyLen, maxScopedLen))
	}
	return Key{kind: kind, param: key.param, fn: key.fn}
}

// Int brings key's value to the canonical form of a decimal integer (a
// signed 64-bit one, without leading zeros or '+': "01" and "+1" are "1"),
// the form gormplugin names a row with an integer primary key by. A value
// that is not such an integer is refused: 404 Not Found when it comes from a
// path parameter (no resource has that name), 400 otherwise.
func Int(key Key) Key {
	return key.canonical("is not an integer", func(v string) (string, bool) {
		n, err := strconv.ParseInt(v, 10, 64)
		return strconv.FormatInt(n, 10), err == nil
	})
}

// UUID brings key's value to the canonical form of a UUID: 36 characters,
// lower-case hexadecimal in groups of 8-4-4-4-12 ("0f8fad5b-d9cb-469f-a165-
// 70867728950e"), the form most UUID types print. It accepts that form in
// either case, the 32 digits without hyphens, and either wrapped in braces
// or after "urn:uuid:". Any other value is refused as Int refuses one.
func UUID(key Key) Key {
	return key.canonical("is not a UUID", canonicalUUID)
}

// Check brings key's value to a canonical form with f, which returns the
// canonical value or an error refusing the request: 404 Not Found when the
// error matches ErrNotFound, 400 otherwise, with the error's text in the JSON
// body (so it should be fit for the client's eyes). f runs on the request's
// goroutine before any Redis call. Check panics with a "ginmw:" message when
// f is nil.
func Check(key Key, f func(v string) (string, error)) Key {
	switch {
	case f == nil:
		panic("ginmw: Check called with a nil function")
	case key.fn == nil:
		panic("ginmw: Check called with a zero Key")
	}
	next := key.fn
	key.fn = func(c *gin.Context) (string, error) {
		v, err := next(c)
		if err != nil {
			return "", err
		}
		cv, err := f(v)
		if err != nil {
			status := http.StatusBadRequest
			if errors.Is(err, ErrNotFound) {
				status = http.StatusNotFound
			}
			return "", &keyError{msg: err.Error(), err: err, status: status}
		}
		return cv, nil
	}
	return key
}

// canonical wraps key's extractor with canon; a value canon refuses is a bad
// key (404 for a path parameter, 400 otherwise) saying what, per the source.
func (k Key) canonical(what string, canon func(string) (string, bool)) Key {
	if k.fn == nil {
		panic("ginmw: Int or UUID called with a zero Key")
	}
	next, param := k.fn, k.param
	k.fn = func(c *gin.Context) (string, error) {
		v, err := next(c)
		if err != nil {
			return "", err
		}
		if cv, ok := canon(v); ok {
			return cv, nil
		}
		if param != "" {
			return "", &keyError{msg: fmt.Sprintf("path parameter %q %s", param, what), status: http.StatusNotFound}
		}
		return "", &keyError{msg: "value " + what}
	}
	return k
}

func canonicalUUID(v string) (string, bool) {
	switch {
	case strings.HasPrefix(v, "urn:uuid:"):
		v = v[len("urn:uuid:"):]
	case len(v) == 38 && v[0] == '{' && v[37] == '}':
		v = v[1:37]
	}
	var hex [32]byte
	switch len(v) {
	case 36:
		if v[8] != '-' || v[13] != '-' || v[18] != '-' || v[23] != '-' {
			return "", false
		}
		v = v[:8] + v[9:13] + v[14:18] + v[19:23] + v[24:]
	case 32:
	default:
		return "", false
	}
	for i := range 32 {
		c := v[i]
		switch {
		case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
		case c >= 'A' && c <= 'F':
			c += 'a' - 'A'
		default:
			return "", false
		}
		hex[i] = c
	}
	h := string(hex[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:], true
}

// keyError is a bad key: it matches ErrBadKey (and ErrNotFound when its status
// is 404) and unwraps to a custom Key's error.
type keyError struct {
	msg    string
	err    error // the Key's error, if any
	status int   // 0: 400
}

func (e *keyError) Error() string { return "ginmw: bad key: " + e.msg }

func (e *keyError) Unwrap() []error {
	errs := []error{ErrBadKey}
	if e.status == http.StatusNotFound {
		errs = append(errs, ErrNotFound)
	}
	if e.err != nil {
		errs = append(errs, e.err)
	}
	return errs
}

// badKey is the answer to a request whose key could not be extracted.
func badKey(err error) *Error {
	e := &Error{Status: http.StatusBadRequest, Kind: ErrBadKey, Cause: err}
	var ke *keyError
	if errors.As(err, &ke) && ke.status != 0 {
		e.Status = ke.status
	}
	return e
}

// name returns the scoped name: "<kind>:<value>", or "<full path>:<value>".
func (k Key) name(c *gin.Context) (string, error) {
	v, err := k.fn(c)
	switch {
	case err != nil:
		if errors.Is(err, ErrBadKey) {
			return "", err
		}
		status := 0
		if errors.Is(err, ErrNotFound) {
			status = http.StatusNotFound
		}
		return "", &keyError{msg: err.Error(), err: err, status: status}
	case v == "":
		return "", &keyError{msg: "empty key"}
	case len(v) > MaxKeyLen:
		return "", &keyError{msg: fmt.Sprintf("key of %d bytes exceeds %d", len(v), MaxKeyLen)}
	}
	scope := k.kind
	if scope == "" {
		scope = c.FullPath()
	}
	var b strings.Builder
	b.Grow(len(scope) + 1 + len(v))
	b.WriteString(scope)
	b.WriteByte(':')
	b.WriteString(v)
	return b.String(), nil
}
