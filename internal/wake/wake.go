// Package wake shares one Redis subscription connection per process (one per
// slot group on a cluster) among every waiter, reference-counted per channel, so
// that waiting for a lock or a cache fill is woken by push instead of polling.
//
// A waiter subscribes before it makes the attempt whose failure makes it wait,
// and Subscribe returns only once Redis has confirmed the subscription, so a
// publish that follows the attempt cannot be missed. Messages can still be lost
// while a connection is re-established; waiters therefore always keep a
// fallback timer (the lease's remaining time), and never rely on push alone.
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

// Hub multiplexes channel subscriptions over shared connections. The zero value
// is not usable; use New. A Hub is safe for concurrent use.
type Hub struct {
	rdb     redis.UniversalClient
	cluster *redis.ClusterClient // non-nil: sharded pub/sub (SSUBSCRIBE), one connection per slot

	mu     sync.Mutex    // guards the fields below
	conns  map[int]*conn // by slot; key 0 when not a cluster
	closed bool
	wg     sync.WaitGroup // reader goroutines
}

// New returns a Hub on rdb. On a *redis.ClusterClient it uses sharded pub/sub;
// otherwise plain SUBSCRIBE on one connection.
func New(rdb redis.UniversalClient) *Hub {
	h := &Hub{rdb: rdb, conns: map[int]*conn{}}
	h.cluster, _ = rdb.(*redis.ClusterClient)
	return h
}

// Sharded reports whether publishers must use SPUBLISH for this hub's channels.
func (h *Hub) Sharded() bool { return h.cluster != nil }

// Sub is one listener on one channel. Close it when done.
type Sub struct {
	c    *conn
	ch   *channel
	msgs chan string
	once sync.Once
}

// C delivers the channel's messages. It is buffered; when the listener falls
// behind, older undelivered messages are dropped (a wake-up is a hint).
func (s *Sub) C() <-chan string { return s.msgs }

// Close releases the listener; the last listener of a channel unsubscribes it.
func (s *Sub) Close() { s.once.Do(func() { s.c.release(s) }) }

// Subscribe registers a listener on channel and returns once Redis has
// confirmed the subscription (or ctx ends).
func (h *Hub) Subscribe(ctx context.Context, channel string) (*Sub, error) {
	slot := 0
	if h.cluster != nil {
		slot = Slot(channel)
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	c := h.conns[slot]
	if c == nil {
		c = h.newConn(slot, channel)
		h.conns[slot] = c
	}
	s := c.add(channel)
	h.mu.Unlock()

	select {
	case <-s.ch.ready:
		return s, nil
	case <-c.done:
		s.Close()
		return nil, ErrClosed
	case <-ctx.Done():
		s.Close()
		return nil, ctx.Err()
	}
}

// Listening reports the number of channels with at least one listener.
func (h *Hub) Listening() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, c := range h.conns {
		c.mu.Lock()
		for _, ch := range c.chans {
			if len(ch.subs) > 0 {
				n++
			}
		}
		c.mu.Unlock()
	}
	return n
}

// Close closes every connection and stops every reader goroutine. Listeners'
// channels are not closed; Subscribe fails afterwards.
func (h *Hub) Close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	conns := h.conns
	h.conns = map[int]*conn{}
	h.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	h.wg.Wait()
}

type state int

const (
	subscribing state = iota
	subscribed
	unsubscribing
)

type channel struct {
	name   string
	linger *time.Timer // pending unsubscribe of an idle channel
	state  state
	again  bool          // a listener arrived while unsubscribing: subscribe again
	ready  chan struct{} // closed when the current subscription is confirmed
	subs   map[*Sub]bool
}

type conn struct {
	hub  *Hub
	ps   *redis.PubSub
	done chan struct{}
	stop context.CancelFunc

	mu      sync.Mutex // guards chans, closing
	chans   map[string]*channel
	closing bool
}

func (h *Hub) newConn(slot int, first string) *conn {
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{hub: h, done: make(chan struct{}), stop: cancel, chans: map[string]*channel{}}
	if h.cluster != nil {
		c.ps = h.cluster.SSubscribe(ctx)
	} else {
		c.ps = h.rdb.Subscribe(ctx)
	}
	h.wg.Add(1)
	go c.read(ctx)
	return c
}

func (c *conn) subscribe(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Errors surface as a reconnect in the reader, which resubscribes every channel.
	if c.hub.cluster != nil {
		c.ps.SSubscribe(ctx, name)
	} else {
		c.ps.Subscribe(ctx, name)
	}
}

func (c *conn) unsubscribe(name string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c.hub.cluster != nil {
		c.ps.SUnsubscribe(ctx, name)
	} else {
		c.ps.Unsubscribe(ctx, name)
	}
}

func (c *conn) add(name string) *Sub {
	c.mu.Lock()
	ch := c.chans[name]
	send := false
	if ch == nil {
		ch = &channel{name: name, ready: make(chan struct{}), subs: map[*Sub]bool{}}
		c.chans[name] = ch
		send = true
	} else if ch.state == unsubscribing && len(ch.subs) == 0 {
		ch.again = true
	}
	if ch.linger != nil {
		ch.linger.Stop()
		ch.linger = nil
	}
	s := &Sub{c: c, ch: ch, msgs: make(chan string, 4)}
	ch.subs[s] = true
	c.mu.Unlock()
	if send {
		c.subscribe(name)
	}
	return s
}

func (c *conn) release(s *Sub) {
	c.mu.Lock()
	ch := s.ch
	delete(ch.subs, s)
	if len(ch.subs) == 0 {
		ch.again = false
		// An idle channel stays subscribed for a moment: a lock under steady
		// contention is waited for again at once, and re-subscribing each time
		// would cost two round trips per wait. (A channel still being
		// subscribed is unsubscribed when its confirmation arrives.)
		if ch.state == subscribed && ch.linger == nil && !c.closing {
			ch.linger = time.AfterFunc(linger, func() { c.idle(ch) })
		}
	}
	c.mu.Unlock()
}

// linger is how long an idle channel stays subscribed.
const linger = 2 * time.Second

func (c *conn) idle(ch *channel) {
	c.mu.Lock()
	send := ch.state == subscribed && len(ch.subs) == 0 && ch.linger != nil && !c.closing
	ch.linger = nil
	if send {
		ch.state = unsubscribing
	}
	c.mu.Unlock()
	if send {
		c.unsubscribe(ch.name)
	}
}

func (c *conn) read(ctx context.Context) {
	defer c.hub.wg.Done()
	defer close(c.done)
	backoff := 10 * time.Millisecond
	for ctx.Err() == nil {
		msg, err := c.ps.ReceiveTimeout(ctx, 10*time.Second)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			var nerr interface{ Timeout() bool }
			if errors.As(err, &nerr) && nerr.Timeout() {
				c.ps.Ping(ctx) // a dead connection fails here and is re-dialled on the next receive
				continue
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Subscription:
			c.confirm(m)
		case *redis.Message:
			c.deliver(m.Channel, m.Payload)
		}
	}
}

func (c *conn) confirm(m *redis.Subscription) {
	c.mu.Lock()
	ch := c.chans[m.Channel]
	var resend, unsend bool
	if ch != nil {
		switch m.Kind {
		case "subscribe", "ssubscribe":
			if ch.state == subscribing {
				ch.state = subscribed
				close(ch.ready)
				if len(ch.subs) == 0 {
					ch.state = unsubscribing
					unsend = true
				}
			}
		case "unsubscribe", "sunsubscribe":
			if ch.state == unsubscribing {
				if ch.again || len(ch.subs) > 0 {
					ch.again = false
					ch.state = subscribing
					ch.ready = make(chan struct{})
					resend = true
				} else {
					delete(c.chans, m.Channel)
				}
			}
		}
	}
	c.mu.Unlock()
	if resend {
		c.subscribe(m.Channel)
	}
	if unsend {
		c.unsubscribe(m.Channel)
	}
}

func (c *conn) deliver(channel, payload string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.chans[channel]
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

func (c *conn) close() {
	c.mu.Lock()
	c.closing = true
	for _, ch := range c.chans {
		if ch.linger != nil {
			ch.linger.Stop()
			ch.linger = nil
		}
	}
	c.mu.Unlock()
	c.stop()
	c.ps.Close()
}
