package ginmw

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/locks"
)

// HTTPError is implemented by errors that know their own HTTP status; Abort
// and ErrorFor answer the first one in an error's chain with it (the error's
// text is the body's "error"). Return one from your handlers' code to extend
// the mapping; an *Error in the chain works too, with every field.
type HTTPError interface {
	error
	HTTPStatus() int
}

// Abort answers a request that failed with err — the answer ErrorFor gives:
// the status, a JSON body {"error": "...", "resource": "...", "retry_after":
// seconds} ("resource" and "retry_after" only when known) and the Retry-After
// header when the answer has a RetryAfter (in whole seconds, rounded up, at
// least 1) — records err with c.Error for the request's log, and aborts the
// chain. An ErrorHandler that keeps the default answer for some errors calls
// Abort with them. Use it as the one place where a
// handler turns what locks, cacheguard, gormplugin and ginmw return into HTTP.
// A request whose client went away is aborted with 499 and nothing written;
// a context.Canceled that a Lock's loss caused (the request context's cause,
// locks.ErrLost) is answered as that loss, and one that ended a Cache load
// (Guard.Shutdown: cacheguard.ErrClosed; the load timeout) as that end.
func Abort(c *gin.Context, err error) {
	c.Error(err) //nolint:errcheck // recorded for loggers
	if errors.Is(err, context.Canceled) {
		switch by := endedBy(c.Request.Context()); {
		case by == context.Canceled:
			c.AbortWithStatus(StatusClientClosedRequest)
			return
		case by != nil: // a lock lost, a Guard closed, a deadline: answered as that
			err = fmt.Errorf("%w: %w", by, err)
		}
	}
	writeError(c, ErrorFor(err))
}

// endedBy tells what ended ctx, a request's context: nil while it has not
// ended; the cause, matching locks.ErrNotHeld, when a Lock further up the
// chain lost its lock (which cancels the context with cause locks.ErrLost);
// the cause, matching cacheguard.ErrClosed, when the handler runs for a
// Cache load that Guard.Shutdown or Close cancelled; context.DeadlineExceeded
// at a deadline (the load timeout's too); context.Canceled when the client
// went away (or the server cancelled the request). Lock, Abort and Cache
// decide by it alone whether anyone is left to answer.
func endedBy(ctx context.Context) error {
	if ctx.Err() == nil {
		return nil
	}
	if cause := context.Cause(ctx); errors.Is(cause, locks.ErrNotHeld) || errors.Is(cause, cacheguard.ErrClosed) ||
		cause == context.DeadlineExceeded {
		return cause
	}
	return ctx.Err()
}

// ErrorFor maps err to the answer Abort gives, the first rule that matches:
//
//   - an *Error in err's chain: itself; an HTTPError: its status and text.
//   - ErrBadKey: 400, or 404 when it also matches ErrNotFound.
//   - Lock lost — locks.ErrNotHeld, which locks.ErrLost (the cause of a Lock
//     request's context once its lock is lost) and a write fenced out by a
//     newer holder (gormplugin.ErrStaleWrite) match: 409 "lock lost",
//     Retry-After 1. Nothing was written
//     under the lock; the client may retry.
//   - Contention — locks.ErrBusy, ErrLocked: 409 "resource locked",
//     Retry-After the holder's remaining lease when known (at least 1s).
//   - Not found — ErrNotFound (the same value as cacheguard.ErrNotFound):
//     404 "no such resource".
//   - The cache's policy refused to load — cacheguard.ErrWaitTimeout,
//     cacheguard.ErrMiss, ErrCacheUnavailable — or a load failed in another
//     process (cacheguard.ErrRemoteLoad), or its answer was not to be cached
//     (cacheguard.ErrUncached: this request got none, and nothing failed):
//     503 "cached response unavailable", Retry-After 1.
//   - Redis unavailable — locks.ErrUnavailable (the same value as
//     cacheguard.ErrUnavailable, which a failed Guard.Invalidate matches too),
//     a closed Locker or Guard: 503 "service unavailable", Retry-After 1. A write that committed but whose
//     invalidation failed is better answered with its success and the error
//     recorded (the cached copies expire with their TTL), as InvalidateAfter
//     does: Abort cannot know that the write committed.
//   - context.DeadlineExceeded: 503 "request timed out", Retry-After 1.
//   - anything else: 500 "internal error" (its text stays in the log).
func ErrorFor(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	var he HTTPError
	if errors.As(err, &he) {
		return &Error{Status: he.HTTPStatus(), Kind: he, Cause: err}
	}
	var ke *keyError
	switch {
	case errors.As(err, &ke):
		return badKey(err)
	case errors.Is(err, locks.ErrNotHeld):
		return &Error{Status: http.StatusConflict, Kind: locks.ErrLost, RetryAfter: time.Second, Cause: err}
	case errors.Is(err, locks.ErrBusy), errors.Is(err, ErrLocked):
		return &Error{Status: http.StatusConflict, Kind: ErrLocked, RetryAfter: max(retryAfter(err), time.Second), Cause: err}
	case errors.Is(err, ErrNotFound):
		return &Error{Status: http.StatusNotFound, Kind: ErrNotFound, Cause: err}
	case errors.Is(err, cacheguard.ErrWaitTimeout), errors.Is(err, cacheguard.ErrMiss),
		errors.Is(err, ErrCacheUnavailable), errors.Is(err, cacheguard.ErrRemoteLoad), errors.Is(err, cacheguard.ErrUncached):
		return &Error{Status: http.StatusServiceUnavailable, Kind: ErrCacheUnavailable, RetryAfter: time.Second, Cause: err}
	case errors.Is(err, locks.ErrUnavailable),
		errors.Is(err, locks.ErrClosed), errors.Is(err, cacheguard.ErrClosed):
		return &Error{Status: http.StatusServiceUnavailable, Kind: locks.ErrUnavailable, RetryAfter: time.Second, Cause: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &Error{Status: http.StatusServiceUnavailable, Kind: errTimedOut, RetryAfter: time.Second, Cause: err}
	}
	return &Error{Status: http.StatusInternalServerError, Kind: errInternal, Cause: err}
}

var (
	errTimedOut = errors.New("ginmw: request timed out")
	errInternal = errors.New("ginmw: internal error")
)

// writeError is what Abort writes, and the default ErrorHandler.
func writeError(c *gin.Context, err *Error) {
	body := gin.H{"error": err.message()}
	if err.Resource != "" {
		body["resource"] = err.Resource
	}
	if err.RetryAfter > 0 {
		s := retryAfterSeconds(err.RetryAfter)
		body["retry_after"] = s
		c.Header("Retry-After", strconv.Itoa(s))
	}
	c.AbortWithStatusJSON(err.Status, body)
}
