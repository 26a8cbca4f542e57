// Package wake shares one Redis subscription connection per process (one per
// master node on a cluster) among every waiter, reference-counted per channel,
// so that waiting for a lock or a cache fill is woken by push instead of polling.
//
// A waiter subscribes before it makes the attempt whose failure makes it wait,
// and Subscribe returns only once Redis has confirmed the subscription, so a
// publish that follows the attempt cannot be missed. Messages can still be lost
// while a connection is re-established; waiters therefore always keep a
// fallback timer (the lease's remaining time), and never rely on push alone.
// After a connection failed, every channel counts as unconfirmed until Redis
// confirms it on the new connection (Subscribe waits for that, as for a new
// channel), and a channel whose UNSUBSCRIBE was sent around the failure —
// go-redis drops it from its resubscribe set before the write, and no
// confirmation comes — counts as unsubscribed and is subscribed again when a
// listener wants it, so no outage, however long, leaves a channel that looks
// subscribed but is not.
//
// On a Redis Cluster, channels are shard channels (SSUBSCRIBE): each is
// subscribed with its own command on the connection to the master that owns
// its slot. go-redis would re-subscribe all channels of a connection in one
// SSUBSCRIBE after a reconnect, which Redis rejects (CROSSSLOT) when they span
// slots; so the Hub never lets a cluster connection reconnect by itself: when
// one fails, when Redis answers MOVED, or when Redis drops a channel because
// its slot moved (an unsolicited SUNSUBSCRIBE), the Hub reloads the slot map
// and subscribes each affected channel again, one command each, wherever its
// slot now lives.
package wake

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrClosed is returned by Subscribe after Close.
var ErrClosed = errors.New("wake: hub closed")

// linger is how long an idle channel stays subscribed: a lock under steady
// contention is waited for again at once, and re-subscribing each time would
// cost two commands per wait.
const linger = 2 * time.Second

// maxConfirm bounds how long Subscribe waits for Redis to confirm.
const maxConfirm = 2 * time.Second

// Hub multiplexes channel subscriptions over shared connections. Use New; a
// Hub is safe for concurrent use.
type Hub struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // non-nil: shard channels, one connection per master

	mu     sync.Mutex          // guards the fields below and every channel's and conn's state
	conns  map[string]*conn    // by master address ("" when not a cluster)
	chans  map[string]*channel // by channel name
	closed bool
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup
}

// New returns a Hub on rdb. On a *redis.ClusterClient it uses shard channels
// (SSUBSCRIBE); otherwise plain SUBSCRIBE on one connection.
func New(rdb redis.UniversalClient) *Hub {
	h := &Hub{rdb: rdb, conns: map[string]*conn{}, chans: map[string]*channel{}, done: make(chan struct{})}
	h.cluster, _ = rdb.(*redis.ClusterClient)
	return h
}

// Sharded reports whether publishers must use SPUBLISH for this hub's channels.
func (h *Hub) Sharded() bool { return h.cluster != nil }

type state int

const (
	detached      state = iota // not sent on any connection yet (being attached)
	subscribing                // SUBSCRIBE sent (or queued for go-redis's reconnect), not confirmed
	subscribed                 // confirmed by Redis on the current connection
	unsubscribing              // UNSUBSCRIBE sent; go-redis no longer re-subscribes it
)

type channel struct {
	name   string
	conn   *conn
	state  state
	again  bool          // a listener arrived while unsubscribing: subscribe again
	ready  chan struct{} // closed when the current subscription is confirmed; replaced when it ends
	failed chan struct{} // closed when the first attach failed (err says why)
	err    error
	subs   map[*Sub]bool
	linger *time.Timer // pending unsubscribe of an idle channel
}

func (ch *channel) confirmed() bool {
	select {
	case <-ch.ready:
		return true
	default:
		return false
	}
}

// unconfirm marks the subscription as no longer confirmed (h.mu held): a
// Subscribe from now on waits for the next confirmation.
func (ch *channel) unconfirm() {
	if ch.confirmed() {
		ch.ready = make(chan struct{})
	}
}

type conn struct {
	addr string
	ps   *redis.PubSub
	stop context.CancelFunc
	dead bool // failed (cluster): no longer used for new subscriptions
}

// Sub is one listener on one channel. Close it when done.
type Sub struct {
	h    *Hub
	ch   *channel
	msgs chan string
	once sync.Once
}

// C delivers the channel's messages. It is buffered; when the listener falls
// behind, the oldest undelivered message is dropped (a wake-up is a hint).
func (s *Sub) C() <-chan string { return s.msgs }

// Close releases the listener; a channel left without listeners is
// unsubscribed after a short linger.
func (s *Sub) Close() { s.once.Do(func() { s.h.release(s) }) }

// Subscribe registers a listener on channel and returns once Redis has
// confirmed the subscription, or ctx ends (an error), or maxConfirm passes:
// then the listener is returned unconfirmed — the subscription completes when
// the connection recovers, and the waiter's fallback timer covers the gap.
func (h *Hub) Subscribe(ctx context.Context, name string) (*Sub, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	ch := h.chans[name]
	fresh := ch == nil
	if fresh {
		ch = &channel{name: name, ready: make(chan struct{}), failed: make(chan struct{}), subs: map[*Sub]bool{}}
		h.chans[name] = ch
	} else if ch.state == unsubscribing && len(ch.subs) == 0 {
		ch.again = true
	}
	if ch.linger != nil {
		ch.linger.Stop()
		ch.linger = nil
	}
	s := &Sub{h: h, ch: ch, msgs: make(chan string, 4)}
	ch.subs[s] = true
	ready, failed := ch.ready, ch.failed
	h.mu.Unlock()

	if fresh {
		if err := h.attach(ctx, ch); err != nil {
			h.detachFailed(ch, s, err)
			return nil, err
		}
	}
	t := time.NewTimer(maxConfirm)
	defer t.Stop()
	select {
	case <-ready:
		return s, nil
	case <-t.C:
		return s, nil
	case <-failed:
		s.Close()
		return nil, ch.err
	case <-h.done:
		s.Close()
		return nil, ErrClosed
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
}

// detachFailed ends a channel whose first attach failed: the channel is
// forgotten (a later Subscribe starts afresh), and the listeners that joined
// it meanwhile fail with the same error.
func (h *Hub) detachFailed(ch *channel, s *Sub, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for o := range ch.subs {
		delete(ch.subs, o)
	}
	if h.chans[ch.name] == ch {
		delete(h.chans, ch.name)
	}
	ch.err = err
	close(ch.failed)
}

// attach subscribes ch on the connection to the node that serves it.
func (h *Hub) attach(ctx context.Context, ch *channel) error {
	addr := ""
	if h.cluster != nil {
		node, err := h.cluster.MasterForKey(ctx, ch.name)
		if err != nil {
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
		c = h.newConn(addr)
		h.conns[addr] = c
	}
	ch.conn, ch.state = c, subscribing
	h.mu.Unlock()
	_ = h.sendCtx(ctx, c, "subscribe", ch.name) // a failed write stays in go-redis's set: subscribed on reconnect
	return nil
}

func (h *Hub) newConn(addr string) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{addr: addr, stop: cancel}
	if h.cluster != nil {
		c.ps = h.cluster.SSubscribe(ctx)
	} else {
		c.ps = h.rdb.Subscribe(ctx)
	}
	h.wg.Add(1)
	go h.read(ctx, c)
	return c
}

// send writes a (un)subscribe command. go-redis keeps a channel being
// subscribed in its set even when the write fails, and subscribes it again on
// reconnect. A channel being unsubscribed leaves that set before the write:
// when the write fails, or the connection fails before Redis confirmed, the
// channel is subscribed nowhere, and no confirmation will come (see
// unsubscribed and reconnected).
func (h *Hub) send(c *conn, op, name string) error {
	return h.sendCtx(context.Background(), c, op, name)
}

func (h *Hub) sendCtx(ctx context.Context, c *conn, op, name string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	switch {
	case op == "subscribe" && h.cluster != nil:
		return c.ps.SSubscribe(ctx, name)
	case op == "subscribe":
		return c.ps.Subscribe(ctx, name)
	case h.cluster != nil:
		return c.ps.SUnsubscribe(ctx, name)
	default:
		return c.ps.Unsubscribe(ctx, name)
	}
}

func (h *Hub) release(s *Sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := s.ch
	delete(ch.subs, s)
	if len(ch.subs) > 0 || h.closed {
		return
	}
	ch.again = false
	if ch.state == subscribed && ch.linger == nil {
		ch.linger = time.AfterFunc(linger, func() { h.idle(ch) })
	}
	// A channel still being subscribed gets its linger when confirmed.
}

func (h *Hub) idle(ch *channel) {
	h.mu.Lock()
	send := !h.closed && ch.linger != nil && ch.state == subscribed && len(ch.subs) == 0
	ch.linger = nil
	if send {
		ch.state = unsubscribing
		ch.unconfirm()
	}
	c := ch.conn
	h.mu.Unlock()
	if send {
		if err := h.send(c, "unsubscribe", ch.name); err != nil {
			h.unsubscribed(c, ch)
		}
	}
}

// unsubscribed ends the unsubscription of ch on c: confirmed by Redis, or
// known to have happened because go-redis dropped the channel (see send). A
// channel that got listeners meanwhile is subscribed again; otherwise it is
// forgotten.
func (h *Hub) unsubscribed(c *conn, ch *channel) {
	h.mu.Lock()
	if h.chans[ch.name] != ch || ch.conn != c || ch.state != unsubscribing {
		h.mu.Unlock()
		return
	}
	resend := ch.again || len(ch.subs) > 0
	if resend {
		ch.again = false
		ch.state = subscribing
	} else {
		delete(h.chans, ch.name)
	}
	h.mu.Unlock()
	if resend {
		_ = h.send(c, "subscribe", ch.name) // kept for the reconnect even if this write fails
	}
}

// reconnected records that c's connection failed (one server: go-redis dials
// again and re-subscribes its set). Subscribed channels stay in that set but
// are unconfirmed until Redis confirms them again; channels being
// unsubscribed are not in it any more, so they are unsubscribed now.
func (h *Hub) reconnected(c *conn) {
	h.mu.Lock()
	var gone []*channel
	for _, ch := range h.chans {
		if ch.conn != c {
			continue
		}
		switch ch.state {
		case subscribed:
			ch.state = subscribing
			ch.unconfirm()
		case unsubscribing:
			gone = append(gone, ch)
		}
	}
	h.mu.Unlock()
	for _, ch := range gone {
		h.unsubscribed(c, ch)
	}
}

// Listening returns the number of channels with at least one listener.
func (h *Hub) Listening() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, ch := range h.chans {
		if len(ch.subs) > 0 {
			n++
		}
	}
	return n
}

// Conns returns the number of subscription connections in use.
func (h *Hub) Conns() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		if !c.dead {
			n++
		}
	}
	return n
}

// Close closes every connection and stops every goroutine of the hub.
// Listeners' channels are not closed; Subscribe fails afterwards.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	close(h.done)
	for _, ch := range h.chans {
		if ch.linger != nil {
			ch.linger.Stop()
			ch.linger = nil
		}
	}
	conns := h.conns
	h.conns = map[string]*conn{}
	h.mu.Unlock()
	for _, c := range conns {
		c.stop()
		_ = c.ps.Close() // closing: nothing to do about an error
	}
	h.wg.Wait()
}

func (h *Hub) read(ctx context.Context, c *conn) {
	defer h.wg.Done()
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		msg, err := c.ps.ReceiveTimeout(ctx, 10*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var nerr interface{ Timeout() bool }
			if errors.As(err, &nerr) && nerr.Timeout() {
				_ = c.ps.Ping(ctx) // a dead connection fails here and shows on the next receive
				continue
			}
			if h.cluster != nil {
				h.fail(c, backoff)
				return
			}
			// One server: go-redis re-dials and re-subscribes its set.
			h.reconnected(c)
			if !h.sleep(backoff) {
				return
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			h.confirm(c, m)
		case *redis.Message:
			h.deliver(c, m.Channel, m.Payload)
		}
	}
}

func (h *Hub) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-h.done:
		return false
	case <-t.C:
		return true
	}
}

// fail retires a cluster connection and re-routes its channels, each with its
// own command, to the masters that serve them now.
func (h *Hub) fail(c *conn, backoff time.Duration) {
	h.mu.Lock()
	c.dead = true
	if h.conns[c.addr] == c {
		delete(h.conns, c.addr)
	}
	var moved []*channel
	for _, ch := range h.chans {
		if ch.conn == c {
			ch.unconfirm()
			moved = append(moved, ch)
		}
	}
	h.mu.Unlock()
	c.stop()
	_ = c.ps.Close() // the connection failed already
	h.reroute(moved, backoff)
}

// reroute reloads the cluster's slot map and subscribes chans again where
// their slots now live, retrying with backoff while no node will take them.
func (h *Hub) reroute(chans []*channel, backoff time.Duration) {
	for len(chans) > 0 {
		if !h.sleep(backoff) {
			return
		}
		backoff = min(2*backoff, time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h.cluster.ReloadState(ctx)
		var retry []*channel
		for _, ch := range chans {
			h.mu.Lock()
			drop := h.closed || h.chans[ch.name] != ch || (len(ch.subs) == 0 && !ch.again && ch.state != subscribing)
			if drop && h.chans[ch.name] == ch {
				if ch.linger != nil {
					ch.linger.Stop()
				}
				delete(h.chans, ch.name)
			}
			h.mu.Unlock()
			if drop {
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

func (h *Hub) confirm(c *conn, m *redis.Subscription) {
	h.mu.Lock()
	ch := h.chans[m.Channel]
	if ch == nil || ch.conn != c {
		h.mu.Unlock()
		return
	}
	var unsub, lost bool
	switch m.Kind {
	case "subscribe", "ssubscribe":
		if ch.state == subscribing {
			ch.state = subscribed
			if !ch.confirmed() {
				close(ch.ready)
			}
			if len(ch.subs) == 0 && !ch.again && ch.linger == nil && !h.closed {
				ch.linger = time.AfterFunc(linger, func() { h.idle(ch) })
			}
		}
	case "unsubscribe", "sunsubscribe":
		switch ch.state {
		case unsubscribing:
			unsub = true
		case subscribed:
			// Not asked for: the channel's slot moved to another node.
			if lost = h.cluster != nil; lost {
				ch.state = subscribing
				ch.unconfirm()
			}
		}
	}
	h.mu.Unlock()
	switch {
	case unsub:
		h.unsubscribed(c, ch)
	case lost:
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.reroute([]*channel{ch}, 10*time.Millisecond)
		}()
	}
}

func (h *Hub) deliver(c *conn, name, payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.chans[name]
	if ch == nil {
		return
	}
	for s := range ch.subs {
		select {
		case s.msgs <- payload:
		default: // full: drop the oldest, keep the newest
			select {
			case <-s.msgs:
			default:
			}
			select {
			case s.msgs <- payload:
			default:
			}
		}
	}
}
