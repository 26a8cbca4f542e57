package ginmw

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/isnil"
	"github.com/cacheguard/cacheguard/locks"
)

// Lock returns middleware that holds the lock named by key while the rest of
// the chain runs: it waits for the lock (up to the Wait budget), runs the
// chain, and releases the lock when the chain returns, panics, or the client
// goes away. See the package documentation for the answers it gives when it
// cannot lock. Lock panics with a "ginmw:" message when l is nil, key is the
// zero Key or an option is invalid.
func Lock(l locks.Locker, key Key, opts ...LockOption) gin.HandlerFunc {
	if l == nil || isnil.Pointer(l) {
		panic("ginmw: Lock called with a nil locks.Locker")
	}
	if key.fn == nil {
		panic("ginmw: Lock called with a zero Key")
	}
	cfg := lockDefaults()
	for _, o := range opts {
		o(&cfg)
	}
	// The default wait first: a locks.WaitBudget among the user's options wins.
	lockOpts := append([]locks.CallOption{locks.WaitBudget(defaultWait)}, cfg.lockOpts...)
	if err := cfg.validate(l, lockOpts); err != nil {
		panic(err)
	}
	// Each request is an owner of its own: a random 128-bit prefix per
	// middleware and a counter, unique without a call to the OS per request.
	ownerPrefix := locks.NewOwnerID() + "."
	var requests atomic.Uint64

	return func(c *gin.Context) {
		if cfg.methods != nil && !cfg.methods[c.Request.Method] {
			c.Next()
			return
		}
		name, err := key.name(c)
		if err == nil && len(name) > locks.MaxNameLen { // a route too long to leave MaxKeyLen for the value
			err = &keyError{msg: fmt.Sprintf("lock name of %d bytes exceeds %d", len(name), locks.MaxNameLen)}
		}
		if err != nil {
			cfg.onError(c, badKey(err))
			return
		}

		orig := c.Request
		ctx := orig.Context()
		if _, ok := locks.OwnerFrom(ctx); !ok {
			ctx = locks.WithOwner(ctx, ownerPrefix+strconv.FormatUint(requests.Add(1), 36))
		}
		lk, err := l.Lock(ctx, name, lockOpts...)
		if err != nil {
			if refused := cfg.refuse(ctx, c, name, err); refused {
				return
			}
			c.Request = orig.WithContext(ctx) // fail open: the owner, but no lock
			defer func() { c.Request = orig }()
			c.Next()
			return
		}

		cctx, cancel := context.WithCancelCause(ctx)
		stop := context.AfterFunc(lk.Context(), func() { cancel(locks.ErrLost) })
		c.Request = orig.WithContext(&lockedCtx{Context: cctx, held: held{lk: lk}})
		returned := false // the chain returned (it did not panic)
		defer func() {
			lost := !stop() && lk.Context().Err() != nil
			cancel(nil)
			c.Request = orig
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
			uerr := lk.Unlock(rctx)
			rcancel()
			switch {
			case lost && returned && !c.Writer.Written():
				// The handler answered nothing (its write refused, or it saw
				// its context end): the default would be a 200.
				cfg.onError(c, &Error{Status: http.StatusConflict, Kind: locks.ErrLost, Resource: name, RetryAfter: time.Second})
				c.Error(&Error{Status: http.StatusConflict, Kind: locks.ErrLost, Resource: name}) //nolint:errcheck // recorded for loggers
			case lost:
				c.Error(&Error{Status: http.StatusConflict, Kind: locks.ErrLost, Resource: name}) //nolint:errcheck // recorded for loggers
			case uerr != nil:
				c.Error(&Error{Status: http.StatusServiceUnavailable, Kind: locks.ErrUnavailable, Resource: name, Cause: uerr}) //nolint:errcheck
			}
		}()
		c.Next()
		returned = true
	}
}

// refuse answers a failed acquisition, or reports false when the handler
// should run unlocked (FailOpen and the lock service is unavailable). It
// classifies the failures of every Locker alike, through the locks
// sentinels: ErrBusy (another owner holds the resource), locks.ErrUnavailable (the
// lock service could not be asked), ErrNotHeld (an enclosing hold of this
// request's owner was lost: locks.ErrLost).
func (cfg *lockConfig) refuse(ctx context.Context, c *gin.Context, name string, err error) bool {
	by := endedBy(ctx)
	ctxEnded := by != nil && errors.Is(err, ctx.Err())
	switch {
	case ctxEnded && by == context.Canceled:
		// The client went away: nobody is left to answer.
		c.AbortWithStatus(StatusClientClosedRequest)
	case ctxEnded && errors.Is(by, cacheguard.ErrClosed):
		// The handler runs for a Cache load its Guard's shutdown cancelled.
		cfg.onError(c, &Error{Status: http.StatusServiceUnavailable, Kind: locks.ErrUnavailable, Resource: name, RetryAfter: time.Second, Cause: by})
	case errors.Is(err, locks.ErrNotHeld), ctxEnded && errors.Is(by, locks.ErrNotHeld):
		// A hold of this request's owner further up the chain was lost.
		cfg.onError(c, &Error{Status: http.StatusConflict, Kind: locks.ErrLost, Resource: name, RetryAfter: time.Second, Cause: err})
	case errors.Is(err, locks.ErrBusy), ctxEnded:
		// Held by another owner for the whole wait budget (or Wait(0) met a
		// held lock), or a deadline set upstream ended the wait: contention.
		cfg.conflict(c, name, retryAfter(err), err)
	case errors.Is(err, locks.ErrInvalid):
		cfg.onError(c, &Error{Status: http.StatusInternalServerError, Kind: locks.ErrUnavailable, Resource: name, Cause: err})
	case errors.Is(err, locks.ErrUnavailable) && !errors.Is(err, locks.ErrClosed) && cfg.failOpen:
		// (A closed Locker is the process shutting down, not an outage.)
		c.Error(&Error{Status: http.StatusServiceUnavailable, Kind: locks.ErrUnavailable, Resource: name, Cause: err}) //nolint:errcheck // recorded for loggers
		return false
	default:
		// Unavailable (fail closed), a closed Locker, too few replicas.
		cfg.onError(c, &Error{Status: http.StatusServiceUnavailable, Kind: locks.ErrUnavailable, Resource: name, RetryAfter: time.Second, Cause: err})
	}
	return true
}

// retryAfter is the holder's remaining lease when the error says it (a
// Client's *NotObtainedError); 0 otherwise.
func retryAfter(err error) time.Duration {
	var noe *locks.NotObtainedError
	if errors.As(err, &noe) {
		return noe.RetryAfter
	}
	return 0
}

func (cfg *lockConfig) conflict(c *gin.Context, name string, retry time.Duration, err error) {
	e := &Error{Status: cfg.conflictStatus, Kind: ErrLocked, Resource: name, RetryAfter: max(retry, time.Second), Cause: err}
	c.Header("Retry-After", strconv.Itoa(retryAfterSeconds(e.RetryAfter)))
	cfg.onError(c, e)
}

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	return max(1, int((d+time.Second-1)/time.Second))
}
