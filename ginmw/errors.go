package ginmw

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/locks"
)

var (
	// ErrBadKey means a Key could not name the request's resource: a missing
	// parameter, header or query value, an empty or over-long key, a value that
	// Int, UUID or Check refused, or a custom Key's error. Lock, Cache and
	// InvalidateAfter answer 400, or 404 when it also matches ErrNotFound.
	ErrBadKey = errors.New("ginmw: bad key")
	// ErrLocked means another request held the resource for the whole wait
	// budget. Lock answers 409 (see ConflictStatus) with Retry-After.
	ErrLocked = errors.New("ginmw: resource locked")
	// ErrNotFound means the request names no resource: an id that Int or UUID
	// refuses in a path parameter, or an error of a Check (or Func) function
	// that wraps it. The request is answered 404. It is the same value as
	// cacheguard.ErrNotFound, which a loader returns for a missing row.
	ErrNotFound = cacheguard.ErrNotFound
)

// StatusClientClosedRequest is the status Lock aborts with when the client went
// away before the lock was obtained (the convention nginx made common). Nothing
// is written to the client.
const StatusClientClosedRequest = 499

// Error is an HTTP answer to a failed request: one that Lock refused, as
// handed to an ErrorHandler, or what ErrorFor maps an error to. It matches
// its Kind and its Cause with errors.Is. Return one (or wrap one) from your
// own code to choose the answer Abort gives.
type Error struct {
	Status     int           // the HTTP status to answer with
	Kind       error         // ErrBadKey, ErrLocked, locks.ErrLost, locks.ErrUnavailable, ErrNotFound, ErrCacheUnavailable, ...
	Resource   string        // the lock or cache name, when known
	RetryAfter time.Duration // when set, the answer carries Retry-After (ErrLocked: the holder's remaining lease, at least 1s)
	Cause      error         // what went wrong underneath, if anything
}

func (e *Error) Error() string {
	if e.Kind == nil {
		return "ginmw: " + e.message()
	}
	msg := e.Kind.Error()
	if e.Resource != "" {
		msg += fmt.Sprintf(" %q", e.Resource)
	}
	if e.Cause != nil && e.Cause != e.Kind {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Unwrap returns the kind and the cause.
func (e *Error) Unwrap() []error {
	var errs []error
	if e.Kind != nil {
		errs = append(errs, e.Kind)
	}
	if e.Cause != nil && e.Cause != e.Kind {
		errs = append(errs, e.Cause)
	}
	return errs
}

// message is the text for the client: the reason of a bad key, otherwise only
// the kind (a Redis error's details are for the server's log, not the client).
func (e *Error) message() string {
	if e.Kind == nil {
		return strings.ToLower(http.StatusText(e.Status))
	}
	if errors.Is(e.Kind, ErrBadKey) && e.Cause != nil {
		return strings.TrimPrefix(e.Cause.Error(), "ginmw: ")
	}
	for _, t := range clientTexts {
		if e.Kind == t.kind {
			return t.text
		}
	}
	return strings.TrimPrefix(e.Kind.Error(), "ginmw: ")
}

// clientTexts are the answers' texts for the kinds other packages define
// (their own messages name the package, which is for the log).
var clientTexts = []struct {
	kind error
	text string
}{
	{locks.ErrNotHeld, "lock lost"},
	{locks.ErrLost, "lock lost"},
	{locks.ErrUnavailable, "service unavailable"},
	{ErrNotFound, "no such resource"},
}
