package locks

import (
	"context"
	"sync"
	"time"
)

// gate lets one caller per process and lock wait in Redis in default mode; the
// others queue here in arrival order, so a process holds one place in the
// lock's queue and the lock is handed from process to process.
//
// The turn to wait in Redis stays with a caller that was granted the lock
// until it releases it (turn, kept by the held lock): its Unlock then queues
// the next caller here in Redis in the release script itself (or hands it the
// lock there, when nobody else waits), so that caller's wait costs no request
// of its own, and tells it the outcome as it passes the turn on.
type gate struct {
	mu    sync.Mutex    // guards the fields below
	taken bool          // a caller waits in Redis, or holds the lock after waiting
	queue []*gateWaiter // callers waiting here, oldest first
	users int           // references: callers and the turn (guarded by Client.mu)
}

// gateWaiter is a caller waiting at a gate.
type gateWaiter struct {
	member string           // its place in the lock's queue in Redis (see acquire.lua)
	turn   chan turnOutcome // receives the turn, once (buffered)
}

// turnOutcome is what the caller passing the turn did for the next one in
// Redis: nothing (the next caller makes its own attempt), queued it, or
// handed it the lock (with the fence). unknown: the release's reply was lost,
// so the next caller must find out with an attempt of its own.
type turnOutcome struct {
	queued, granted, unknown bool
	fence                    uint64
	fenceV                   any
	sent                     time.Time // when the release that granted it was sent: its claim lease runs from then
}

func (c *Client) gate(key string) *gate {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.gates[key]
	if g == nil {
		g = &gate{}
		c.gates[key] = g
	}
	g.users++
	return g
}

func (c *Client) ungate(key string, g *gate) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.users--; g.users == 0 {
		delete(c.gates, key)
	}
}

// waiting reports whether a caller of this process waits in Redis for the
// lock key, or holds it after waiting (then an attempt of another caller
// could only fail).
func (c *Client) waiting(key string) bool {
	c.mu.Lock()
	g := c.gates[key]
	c.mu.Unlock()
	if g == nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.taken
}

// enter waits for w's turn. It returns what the previous holder of the turn
// did for w in Redis, and owned: whether w has the turn (then it must pass it
// on, or keep it in a grant). When ctx ends while the turn is being passed to
// w, enter waits for it (the passer is at most one release away) and returns
// it owned, with ctx's error: the caller gives back what was done for it.
func (g *gate) enter(ctx context.Context, w *gateWaiter) (o turnOutcome, owned bool, err error) {
	g.mu.Lock()
	if !g.taken {
		g.taken = true
		g.mu.Unlock()
		return turnOutcome{}, true, nil
	}
	g.queue = append(g.queue, w)
	g.mu.Unlock()
	select {
	case o = <-w.turn:
		return o, true, nil
	case <-ctx.Done():
		g.mu.Lock()
		for i, q := range g.queue {
			if q == w {
				g.queue = append(g.queue[:i], g.queue[i+1:]...)
				g.mu.Unlock()
				return turnOutcome{}, false, ctx.Err()
			}
		}
		g.mu.Unlock()
		return <-w.turn, true, ctx.Err() // claimed: its outcome is at most a release away
	}
}

// claim takes the next waiter out of the queue, for the turn's holder to act
// for in Redis before passing it the turn (pass); nil when none waits.
func (g *gate) claim() *gateWaiter {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) == 0 {
		return nil
	}
	w := g.queue[0]
	g.queue = g.queue[1:]
	return w
}

// pass gives the turn to w (claimed) with what was done for it, or, when w is
// nil, to the next waiter with nothing done (or frees it).
func (g *gate) pass(w *gateWaiter, o turnOutcome) {
	if w != nil {
		w.turn <- o
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.queue) > 0 {
		g.queue[0].turn <- turnOutcome{}
		g.queue = g.queue[1:]
		return
	}
	g.taken = false
}

// turnKeeper is a gate turn kept by a lock granted after waiting.
type turnKeeper struct {
	c   *Client
	key string
	g   *gate
}

// pass passes the turn (see gate.pass) and drops the keeper's reference.
func (t *turnKeeper) pass(w *gateWaiter, o turnOutcome) {
	t.g.pass(w, o)
	t.c.ungate(t.key, t.g)
}
