package ginmw

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/locks"
)

// defaultWait is how long Lock waits for a held resource before answering
// 409, unless LockOptions sets locks.WaitBudget. It is short because a person is
// usually waiting for the answer: an edit that queues longer than a few
// seconds is better refused with Retry-After.
const defaultWait = 5 * time.Second

// releaseTimeout bounds the release after the handler; the client's disconnect
// cannot cancel it.
const releaseTimeout = 5 * time.Second

// LockOption configures Lock.
type LockOption func(*lockConfig)

type lockConfig struct {
	conflictStatus int
	failOpen       bool
	methods        map[string]bool // nil: every method
	lockOpts       []locks.CallOption
	onError        func(c *gin.Context, err *Error)
}

func lockDefaults() lockConfig {
	return lockConfig{conflictStatus: http.StatusConflict, onError: writeError}
}

// ConflictStatus sets the status of a request refused because the resource
// stayed locked, e.g. http.StatusLocked (423) or 503. The default is 409
// Conflict. It must be a client or server error status (400-599): a refused
// request must never read as a success, a redirect or an interim answer to a
// client, a retrying HTTP library or a proxy.
func ConflictStatus(code int) LockOption { return func(c *lockConfig) { c.conflictStatus = code } }

// FailOpen runs the handler without the lock when the lock service is
// unavailable, instead of answering 503; Fence then reports no token. Use it
// only where losing mutual exclusion during an outage is acceptable. The
// default fails closed.
func FailOpen() LockOption { return func(c *lockConfig) { c.failOpen = true } }

// Methods locks only requests with one of these methods; the others pass
// through unlocked, e.g. Methods("POST", "PUT", "PATCH", "DELETE") leaves
// GET and HEAD free. The default locks every method.
func Methods(methods ...string) LockOption {
	return func(c *lockConfig) {
		c.methods = map[string]bool{}
		for _, m := range methods {
			c.methods[strings.ToUpper(m)] = true
		}
	}
}

// LockOptions passes options to every acquisition: the wait budget
// (locks.WaitBudget: how long a request waits for a resource another request
// holds before it is refused with ErrLocked; zero refuses at once; the
// request's own context can end the wait sooner), the lease, fair mode,
// replicas. The default is the Locker's own defaults, except the wait budget:
// 5s, since a person is usually waiting for the answer.
func LockOptions(opts ...locks.CallOption) LockOption {
	return func(c *lockConfig) { c.lockOpts = append(c.lockOpts, opts...) }
}

// ErrorHandler sets what Lock does with a request it refuses (bad key,
// contention, lock service unavailable): h writes the answer, and Lock aborts
// the chain after it, whatever h does, so the handler after Lock never runs
// unlocked. When it is called for ErrLocked, the Retry-After header is
// already set. The default answers as Abort does.
func ErrorHandler(h func(c *gin.Context, err *Error)) LockOption {
	return func(c *lockConfig) {
		c.onError = nil
		if h != nil {
			c.onError = func(ctx *gin.Context, err *Error) { h(ctx, err); ctx.Abort() }
		}
	}
}

// validate checks the options of a Lock on l that passes lockOpts to every
// acquisition, as l's own call would check them (locks.CheckCallOptions).
func (c *lockConfig) validate(l locks.Locker, lockOpts []locks.CallOption) error {
	switch {
	case c.conflictStatus < 400 || c.conflictStatus > 599:
		return fmt.Errorf("ginmw: ConflictStatus %d is not a client or server error status (400-599)", c.conflictStatus)
	case c.onError == nil:
		return errors.New("ginmw: nil ErrorHandler")
	case c.methods != nil && len(c.methods) == 0:
		return errors.New("ginmw: Methods called with no method: Lock would lock nothing")
	}
	for m := range c.methods {
		if !isToken(m) {
			return fmt.Errorf("ginmw: Methods called with %q, which is not a method name", m)
		}
	}
	if err := locks.CheckCallOptions(l, lockOpts...); err != nil {
		return fmt.Errorf("ginmw: Lock: %w", err)
	}
	return nil
}
