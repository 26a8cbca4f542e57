package locks

import (
	"time"

	"github.com/redis/go-redis/v9"
)

// Queued is how many of the client's calls wait for a pipeline (tests only).
func (c *Client) Queued() int {
	c.b.mu.Lock()
	defer c.b.mu.Unlock()
	return len(c.b.queue)
}

// Senders reports how many sender goroutines c's batcher has started (tests only).
func (c *Client) Senders() int64 { return c.b.started.Load() }

// NodeQueue reports, for node i of r, how many script calls wait for a
// pipeline, how many of those their callers abandoned, and whether the node
// has nothing on the wire or queued (tests only).
func (r *Redlock) NodeQueue(i int) (queued, gaveUp int, idle bool) {
	b := r.nodes[i].b
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.queue {
		if p.state.Load() == abandoned {
			gaveUp++
		}
	}
	return len(b.queue), gaveUp, b.busy == 0 && len(b.queue) == 0
}

// Closing reports whether Close or Shutdown has begun (tests only: it
// observes the closing without making a call).
func (c *Client) Closing() bool { return c.life.closed.Load() }

// IsRedlockAcquire reports whether cmd runs Redlock's acquire script, and its
// lock key (tests only: hooks pick the command by script, not by shape).
func IsRedlockAcquire(cmd interface{ Args() []any }) (key string, ok bool) {
	sc, key := scriptCall(cmd.(redis.Cmder))
	return key, sc == &redlockAcquireS
}

// Ended reports, for a test's evidence, how l's hold stands:
// its local deadline, the hand-over margin of its lease, whether it has
// ended, and why (nil once released) (tests only).
func (l *Lock) Ended() (deadline time.Time, margin time.Duration, ended bool, err error) {
	l.h.mu.Lock()
	defer l.h.mu.Unlock()
	return l.h.deadline, grant{Lease: l.h.lease}.Margin(), l.h.ended, l.h.err
}

// Failures is the count of consecutive failures b holds now (tests only).
func (b *Breaker) Failures() int { return int(b.failures.Load()) }
