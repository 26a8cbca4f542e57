package gen

import (
	"context"
	"time"
)

// ReplyGivenUp returns what a fault hook waits on in place of a reply that is
// late or never comes: a channel closed when a socket read under ctx gives
// up, and the error it then fails with. That is ctx's deadline as well as its
// end: go-redis with ContextTimeoutEnabled puts the deadline on the
// connection, and a context of this module's may carry a deadline earlier
// than its Done (rcmd.Uncancelled under a shared tick). stop releases the
// timer; call it once the wait is over.
func ReplyGivenUp(ctx context.Context) (done <-chan struct{}, err func() error, stop func()) {
	dl, ok := ctx.Deadline()
	if !ok {
		return ctx.Done(), ctx.Err, func() {}
	}
	wire, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(time.Until(dl), func() { cancel(context.DeadlineExceeded) })
	err = func() error {
		if e := ctx.Err(); e != nil {
			return e
		}
		return context.Cause(wire)
	}
	return wire.Done(), err, func() { t.Stop(); cancel(nil) }
}
