package locks

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/internal/wake"
)

// gate is where this process's callers wait for one lock. It holds the
// process's one subscription to the client's hand-off channel for the lock
// (see Client.channel), which routes each hand-off to the waiter it names, so
// that a hand-off costs the same whether one caller or a thousand wait here.
//
// In default mode it also lets one caller per process wait in Redis; the
// others queue here in arrival order, so a process holds one place in the
// lock's queue and the lock is handed from process to process.
//
// The turn to wait in Redis stays with a caller that was granted the lock
// until it releases it (turn, kept by the held lock): its Unlock then queues
// the next caller here in Redis in the release script itself (or hands it the
// lock there, when nobody else waits), so that caller's wait costs no request
// of its own, and tells it the outcome as it passes the turn on.
type gate struct {
	mu     sync.Mutex             // guards the fields below
	taken  bool                   // a caller waits in Redis, or holds the lock after waiting
	queue  []*gateWaiter          // callers waiting here, oldest first
	handed map[string]chan uint64 // by acquisition id: the callers listening for a hand-off, given its fence

	users int // references: callers and the turn (guarded by Client.mu)

	subscribed chan struct{} // closed once sub (or subErr) is set
	sub        *wake.Sub
	subErr     error
}

// gateWaiter is a caller waiting at a gate.
type gateWaiter struct {
	owner  string           // its owner, under WithOwner ("" otherwise)
	member string           // its place in the lock's queue in Redis (see acquire.lua)
	turn   chan turnOutcome // receives the turn, once (buffered; sent under the gate's mu)
	back   []any            // the release.lua call that gives back what may be done for it (see Client.giveBackCall)
	gaveUp bool             // it left after being claimed: the passer gives back and passes on (guarded by the gate's mu)
}

// turnOutcome is what the caller passing the turn did for the next one in
// Redis: nothing (the next caller makes its own attempt), queued it, or
// handed it the lock (with the fence). unknown: the release's reply was lost,
// so the next caller must find out with an attempt of its own.
//
// reenter is no turn: the waiter's owner was granted the lock, and the
// waiter leaves the queue to re-enter that holding (see ownerGranted).
type turnOutcome struct {
	queued, granted, unknown, reenter bool
	fence                             uint64
	fenceV                            any
	sent                              time.Time // when the release that granted it was sent: its claim lease runs from then
}

// openGate returns the gate of the lock key with a reference to it (give it
// back with ungate), once the gate's subscription is confirmed by Redis (see
// wake.Hub.Subscribe) or ctx ends (an error). The first caller subscribes;
// the others wait for it, and subscribe afresh if it gave up first.
func (c *Client) openGate(ctx context.Context, key string) (*gate, error) {
	for {
		c.mu.Lock()
		g := c.gates[key]
		fresh := g == nil
		if fresh {
			g = &gate{handed: map[string]chan uint64{}, subscribed: make(chan struct{})}
			c.gates[key] = g
		}
		g.users++
		c.mu.Unlock()
		if fresh {
			g.sub, g.subErr = c.hub.SubscribeFunc(ctx, c.channel(key), g.heard)
			if g.subErr != nil {
				c.mu.Lock()
				if c.gates[key] == g {
					delete(c.gates, key) // the next caller starts afresh
				}
				c.mu.Unlock()
			}
			close(g.subscribed)
		}
		select {
		case <-g.subscribed:
		case <-ctx.Done():
			c.ungate(key, g)
			return nil, ctx.Err()
		}
		if g.subErr == nil {
			return g, nil
		}
		c.ungate(key, g)
		if fresh || ctx.Err() != nil {
			return nil, g.subErr
		}
	}
}

// ref takes one more reference to g, which the caller has one of.
func (c *Client) ref(g *gate) {
	c.mu.Lock()
	g.users++
	c.mu.Unlock()
}

// ungate gives back a reference to g; the last one closes its subscription.
func (c *Client) ungate(key string, g *gate) {
	c.mu.Lock()
	g.users--
	last := g.users == 0
	if last && c.gates[key] == g {
		delete(c.gates, key)
	}
	c.mu.Unlock()
	if last && g.sub != nil {
		g.sub.Close()
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

// listen makes the hand-off of the lock to acquisition acq reach the
// returned channel, until unlisten.
func (g *gate) listen(acq string) <-chan uint64 {
	ch := make(chan uint64, 1)
	g.mu.Lock()
	g.handed[acq] = ch
	g.mu.Unlock()
	return ch
}

func (g *gate) unlisten(acq string) {
	g.mu.Lock()
	delete(g.handed, acq)
	g.mu.Unlock()
}

// heard routes a message of the hand-off channel, "<acquisition id> <fence>"
// (see release.lua), to the caller it names, if it listens (on the hub's
// goroutine: it never blocks).
func (g *gate) heard(payload string) {
	who, f, ok := strings.Cut(payload, " ")
	if !ok {
		return
	}
	g.mu.Lock()
	ch := g.handed[who]
	g.mu.Unlock()
	if ch == nil {
		return
	}
	fence, _ := strconv.ParseUint(f, 10, 64)
	select {
	case ch <- fence:
	default: // told already
	}
}

// enter waits for w's turn. It returns what the previous holder of the turn
// did for w in Redis, and owned: whether w has the turn (then it must pass it
// on, or keep it in a grant). When ctx ends first, enter returns at once, not
// owned: a w still queued here leaves the queue; a w already claimed by a
// release on the wire (which may hang on Redis) is marked as gone, and that
// release's passer gives back what it did for w and passes the turn on (see
// pass). When the turn came just before ctx ended, enter returns it owned,
// with ctx's error: the caller gives back what was done for it.
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
		return o, !o.reenter, nil
	case <-ctx.Done():
		g.mu.Lock()
		defer g.mu.Unlock()
		for i, q := range g.queue {
			if q == w {
				g.queue = append(g.queue[:i], g.queue[i+1:]...)
				return turnOutcome{}, false, ctx.Err()
			}
		}
		select {
		case o = <-w.turn: // passed meanwhile
			return o, !o.reenter, ctx.Err()
		default:
			w.gaveUp = true // claimed: its passer takes care of it
			return turnOutcome{}, false, ctx.Err()
		}
	}
}

// ownerGranted takes the waiters of owner out of the queue and tells them
// to re-enter the holding just granted to owner (an owner's callers never
// wait for one another).
func (g *gate) ownerGranted(owner string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	q := g.queue[:0]
	for _, w := range g.queue {
		if w.owner == owner {
			w.turn <- turnOutcome{reenter: true}
			continue
		}
		q = append(q, w)
	}
	clear(g.queue[len(q):])
	g.queue = q
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
// nil or gave up meanwhile, to the next waiter with nothing done (or frees
// it). It reports whether w gave up: then what was done for it is the
// passer's to give back.
func (g *gate) pass(w *gateWaiter, o turnOutcome) (gaveUp bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if w != nil && !w.gaveUp {
		w.turn <- o
		return false
	}
	if len(g.queue) > 0 {
		g.queue[0].turn <- turnOutcome{}
		g.queue = g.queue[1:]
	} else {
		g.taken = false
	}
	return w != nil
}

// turnKeeper is a gate turn kept by a lock granted after waiting.
type turnKeeper struct {
	c   *Client
	key string
	g   *gate
}

// pass passes the turn (see gate.pass) and drops the keeper's reference.
// When w gave up after being claimed, what was done for it in Redis is given
// back, without waiting (the passer is an Unlock, which must not wait on
// another caller's behalf): the release that did it has answered, so the
// give-back runs after it.
func (t *turnKeeper) pass(w *gateWaiter, o turnOutcome) {
	if t.g.pass(w, o) && (o.queued || o.granted || o.unknown) {
		t.c.b.later(w.back)
	}
	t.c.ungate(t.key, t.g)
}
