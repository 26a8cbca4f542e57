package wake

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Bounds of the connection life cycle.
const (
	// dialTimeout bounds connecting (and any write that has to connect
	// first): a connection attempt into a black hole fails after it, and the
	// next one is made after the backoff.
	dialTimeout = time.Second
	// writeTimeout bounds writing one (un)subscribe command.
	writeTimeout = time.Second
	// minBackoff and maxBackoff bound the delay between a connection's
	// failure and the next connection to the same address; it doubles per
	// failure and starts again at minBackoff once a connection is up.
	minBackoff = 10 * time.Millisecond
	maxBackoff = 250 * time.Millisecond
)

// conn is one subscription connection, owned by the Hub: it is replaced, never
// repaired in place.
type conn struct {
	addr string
	ps   *redis.PubSub
	stop context.CancelFunc // ends the conn's goroutines
	born time.Time
	up   bool // connected: commands are written at once, else when it is
	dead bool // retired: no longer used for new subscriptions

	// pending holds every channel with a (un)subscribe command for this conn
	// that Redis has not confirmed yet.
	pending map[*channel]*pend
	probes  map[string]time.Time // PINGs not answered yet, by payload: when each was sent
	seq     uint64               // the last PING's payload
	heard   time.Time            // when the conn last received anything
	kick    chan struct{}        // wakes the watcher when a command is pending (buffered)
}

// pend is one unconfirmed command.
type pend struct {
	gen   uint64    // the channel's command count when it was sent
	since time.Time // when the command was decided
	sent  time.Time // when its write returned (zero until then)
}

// newConn starts a connection to addr (h.mu held); node is the cluster's
// client of that master (nil on one server). The connection is made by the
// conn's goroutine; channels attached meanwhile are subscribed once it is up.
func (h *Hub) newConn(addr string, node *redis.Client) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{addr: addr, stop: cancel, born: time.Now(), pending: map[*channel]*pend{}, probes: map[string]time.Time{},
		heard: time.Now(), kick: make(chan struct{}, 1)}
	if node != nil {
		c.ps = node.SSubscribe(ctx) // bound to the master's address, whichever channel comes first
	} else {
		c.ps = h.rdb.Subscribe(ctx)
	}
	h.conns[addr] = c
	h.wg.Add(2)
	go h.run(ctx, c)
	go h.watch(ctx, c)
	return c
}

// run connects c, subscribes what was attached meanwhile and reads until c
// fails or is closed. Connecting is bounded by the watcher, not by go-redis:
// its handshake waits out the client's ReadTimeout whatever the context says,
// so an attempt into a partition is abandoned (c retired, a new attempt made)
// after dialTimeout, and closed here when it returns.
func (h *Hub) run(ctx context.Context, c *conn) {
	defer h.wg.Done()
	h.mu.Lock()
	payload := h.probe(c, time.Now())
	h.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	err := c.ps.Ping(dctx, payload) // connects; its PONG proves the connection
	cancel()
	h.mu.Lock()
	if c.dead || err != nil {
		dead := c.dead
		h.mu.Unlock()
		_ = c.ps.Close() // never connected, or abandoned
		if !dead {
			h.fail(c)
		}
		return
	}
	c.up = true
	h.backoff[c.addr] = 0
	select { // the watcher slept for the connection attempt: its schedule starts now
	case c.kick <- struct{}{}:
	default:
	}
	type cmd struct {
		ch  *channel
		gen uint64
	}
	var todo []cmd
	for ch, p := range c.pending {
		if ch.state == subscribing {
			todo = append(todo, cmd{ch, p.gen})
		}
	}
	h.mu.Unlock()
	for _, x := range todo {
		h.write(ctx, c, x.ch, x.gen, "subscribe")
	}
	h.read(ctx, c)
}

func (h *Hub) read(ctx context.Context, c *conn) {
	for {
		msg, err := c.ps.Receive(ctx)
		if err != nil {
			if ctx.Err() == nil {
				h.fail(c)
			}
			return
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			h.confirm(c, m)
		case *redis.Message:
			h.deliver(c, m.Channel, m.Payload)
		case *redis.Pong:
			if h.answered(c, m.Payload) {
				h.fail(c)
				return
			}
			h.mu.Lock()
			ls := h.alive(c)
			h.mu.Unlock()
			tell(ls)
		}
	}
}

// attach subscribes ch on the connection to the node that serves it.
func (h *Hub) attach(ctx context.Context, ch *channel) error {
	addr := ""
	var node *redis.Client
	if h.cluster != nil {
		var err error
		if node, err = h.cluster.MasterForKey(ctx, ch.name); err != nil {
			return err
		}
		addr = node.Options().Addr
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return ErrClosed
	}
	c := h.conns[addr]
	if c == nil || c.dead {
		c = h.newConn(addr, node)
	}
	if ch.conn != nil && ch.conn != c {
		delete(ch.conn.pending, ch)
	}
	ch.conn, ch.state, ch.again = c, subscribing, false
	gen := h.expect(c, ch)
	up := c.up
	h.mu.Unlock()
	if up {
		h.write(ctx, c, ch, gen, "subscribe")
	}
	return nil
}

// expect records that a command for ch is about to be written on c (h.mu
// held) and returns its number, for write.
func (h *Hub) expect(c *conn, ch *channel) uint64 {
	ch.gen++
	c.pending[ch] = &pend{gen: ch.gen, since: time.Now()}
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return ch.gen
}

// write sends the (un)subscribe command numbered gen for ch on c, and records
// when the write returned: a PING written after that time is answered only
// after the command's confirmation. An error needs no handling here: a
// broken connection fails its reader, and a command that never arrived is
// found out by the watcher.
//
// The write is bounded by writeTimeout alone, never by the context of the
// caller it is for (ctx's values are kept): the connection is shared, and
// go-redis replaces a PubSub connection whose write failed — a caller whose
// context ended before or during the write (its budget spent by the attempt
// before it) would cut every other channel of the connection off until the
// replacement re-subscribed them.
func (h *Hub) write(ctx context.Context, c *conn, ch *channel, gen uint64, op string) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	sharded := h.cluster != nil && !ch.classic
	switch {
	case op == "subscribe" && sharded:
		_ = c.ps.SSubscribe(wctx, ch.name)
	case op == "subscribe":
		_ = c.ps.Subscribe(wctx, ch.name)
	case sharded:
		_ = c.ps.SUnsubscribe(wctx, ch.name)
	default:
		_ = c.ps.Unsubscribe(wctx, ch.name)
	}
	cancel()
	h.mu.Lock()
	if p := c.pending[ch]; p != nil && p.gen == gen {
		p.sent = time.Now()
	}
	h.mu.Unlock()
}

// fail retires c and subscribes its channels again, each with its own
// command, on a fresh connection (on a cluster, wherever their slots now
// live). It may be called more than once.
func (h *Hub) fail(c *conn) {
	h.mu.Lock()
	if c.dead {
		h.mu.Unlock()
		return
	}
	c.dead = true
	if h.conns[c.addr] == c {
		delete(h.conns, c.addr)
	}
	backoff := max(h.backoff[c.addr], minBackoff)
	h.backoff[c.addr] = min(2*backoff, maxBackoff)
	var moved []*channel
	var down []live
	for _, ch := range h.chans {
		if ch.conn == c {
			if ch.state == subscribed {
				for s := range ch.subs {
					if s.l != nil {
						down = append(down, live{s.l, 0})
					}
				}
			}
			ch.unconfirm()
			moved = append(moved, ch)
		}
	}
	closed, up := h.closed, c.up
	h.mu.Unlock()
	tell(down)
	c.stop()
	if up {
		_ = c.ps.Close() // the connection failed already
	} // else run closes it when its attempt returns
	if !closed {
		h.reroute(moved, backoff)
	}
}

// reroute subscribes chans again after backoff (on a cluster, after reloading
// the slot map, where their slots now live), retrying with a longer backoff
// while no node will take them. A channel nobody listens to any more is
// forgotten instead.
func (h *Hub) reroute(chans []*channel, backoff time.Duration) {
	for len(chans) > 0 {
		if !h.sleep(backoff) {
			return
		}
		backoff = min(2*backoff, maxBackoff)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if h.cluster != nil {
			h.cluster.ReloadState(ctx)
		}
		var retry []*channel
		for _, ch := range chans {
			h.mu.Lock()
			keep := !h.closed && h.chans[ch.name] == ch && (len(ch.subs) > 0 || ch.again || ch.state == subscribing)
			if !keep && h.chans[ch.name] == ch {
				h.forget(ch)
			}
			h.mu.Unlock()
			if !keep {
				continue
			}
			if err := h.attach(ctx, ch); err != nil {
				retry = append(retry, ch)
			}
		}
		cancel()
		chans = retry
	}
}
