package ginmw

import (
	"errors"
	"fmt"
	"strings"

	"github.com/gin-gonic/gin"
)

// MaxKeyLen bounds the value a KeyFunc extracts, in bytes; a longer value is a
// bad key (400). It keeps lock names and cache keys far below Redis limits and
// below locks.MaxNameLen once scoped.
const MaxKeyLen = 256

// KeyFunc says which resource a request names: a path parameter (Param), a
// header (Header), a query value (Query) or anything a function computes
// (Func), scoped either to a resource kind (Resource) or, by default, to the
// route's full path. The zero KeyFunc is invalid.
type KeyFunc struct {
	kind string // resource kind; "" scopes the key to the route's full path
	fn   func(c *gin.Context) (string, error)
}

// Param extracts the path parameter name (as in "/repos/:id").
func Param(name string) KeyFunc {
	return KeyFunc{fn: func(c *gin.Context) (string, error) {
		if v := c.Param(name); v != "" {
			return v, nil
		}
		return "", &keyError{msg: fmt.Sprintf("path parameter %q is missing", name)}
	}}
}

// Header extracts the value of the request header name.
func Header(name string) KeyFunc {
	return KeyFunc{fn: func(c *gin.Context) (string, error) {
		if v := c.GetHeader(name); v != "" {
			return v, nil
		}
		return "", &keyError{msg: fmt.Sprintf("header %q is missing", name)}
	}}
}

// Query extracts the value of the URL query parameter name.
func Query(name string) KeyFunc {
	return KeyFunc{fn: func(c *gin.Context) (string, error) {
		if v := c.Query(name); v != "" {
			return v, nil
		}
		return "", &keyError{msg: fmt.Sprintf("query parameter %q is missing", name)}
	}}
}

// Func extracts a key with f. An error from f refuses the request with 400 and
// the error's text in the JSON body, so it should be fit for the client's eyes.
// f runs on the request's goroutine before the handler.
func Func(f func(c *gin.Context) (string, error)) KeyFunc {
	if f == nil {
		panic("ginmw: Func called with a nil function")
	}
	return KeyFunc{fn: f}
}

// Resource scopes key to a resource kind: Resource("repos", Param("id")) names
// "repos:<id>", the name gormplugin uses for the row of table repos with that
// primary key, so every route and every GORM write on the row shares one lock.
func Resource(kind string, key KeyFunc) KeyFunc {
	switch {
	case kind == "":
		panic("ginmw: Resource called with an empty kind")
	case key.fn == nil:
		panic("ginmw: Resource called with a zero KeyFunc")
	}
	return KeyFunc{kind: kind, fn: key.fn}
}

// keyError is a bad key: it matches ErrBadKey and unwraps to a custom
// KeyFunc's error.
type keyError struct {
	msg string
	err error // the KeyFunc's error, if any
}

func (e *keyError) Error() string { return "ginmw: bad key: " + e.msg }

func (e *keyError) Unwrap() []error {
	if e.err == nil {
		return []error{ErrBadKey}
	}
	return []error{ErrBadKey, e.err}
}

// name returns the scoped name: "<kind>:<value>", or "<full path>:<value>".
func (k KeyFunc) name(c *gin.Context) (string, error) {
	v, err := k.fn(c)
	switch {
	case err != nil:
		if errors.Is(err, ErrBadKey) {
			return "", err
		}
		return "", &keyError{msg: err.Error(), err: err}
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
