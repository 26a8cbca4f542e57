package gen

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
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

// StuckConn is a client's connection on which a request can get stuck on the
// wire. When Keep says so for a write, the write is kept and the connection
// breaks from then on (reads end with io.EOF, as when the peer closed;
// writes fail), so that the client gives up on it — and would send the
// request again on another connection, unless told not to; Keep's d after,
// the kept request reaches the server on it all the same (stuck in a
// retransmit queue, a proxy), its reply is read by nobody but the fault, the
// connection closes, and landed is called. The goroutine that delivers it is
// Keep's caller's to account for: landed tells it the goroutine is done.
type StuckConn struct {
	net.Conn
	// Keep reports whether the write b is kept, for how long, and what to
	// call once it has reached the server and its reply came (or not).
	Keep   func(b []byte) (d time.Duration, landed func(), keep bool)
	broken atomic.Bool
}

func (c *StuckConn) Write(b []byte) (int, error) {
	if c.broken.Load() {
		return 0, io.ErrClosedPipe
	}
	d, landed, keep := c.Keep(b)
	if !keep {
		return c.Conn.Write(b)
	}
	c.broken.Store(true)
	kept := bytes.Clone(b)
	go func() {
		defer landed()
		defer c.Conn.Close()
		time.Sleep(d) // the fault: the request is stuck on the wire
		_ = c.Conn.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Conn.Write(kept); err == nil {
			_, _ = c.Conn.Read(make([]byte, 512)) // the server ran it: the reply comes
		}
	}()
	return len(b), nil
}

func (c *StuckConn) Read(b []byte) (int, error) {
	if c.broken.Load() {
		return 0, io.EOF
	}
	return c.Conn.Read(b)
}

// Close leaves a broken connection to its kept request's goroutine.
func (c *StuckConn) Close() error {
	if c.broken.Load() {
		return nil
	}
	return c.Conn.Close()
}
