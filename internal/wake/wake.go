// Package wake shares one Redis subscription connection per process (one per
// master node on a cluster) among every waiter, reference-counted per channel,
// so that waiting for a lock or a cache fill is woken by push instead of polling.
//
// A waiter subscribes before it makes the attempt whose failure makes it wait,
// and Subscribe returns only once Redis has confirmed the subscription, so a
// publish that follows the attempt cannot be missed. Messages can still be lost
// while a connection is re-established; waiters therefore always keep a
// fallback timer (the lease's remaining time), and never rely on push alone.
//
// The Hub, not go-redis, owns reconnection, on one server as on a cluster:
// when a connection fails, the Hub retires it and subscribes each of its
// channels again, one command each, on a fresh connection (on a cluster,
// after reloading the slot map, wherever each channel's slot now lives:
// go-redis would re-subscribe all channels of a connection in one SSUBSCRIBE,
// which Redis rejects with CROSSSLOT when they span slots). Until Redis
// confirms a channel on the new connection it counts as unconfirmed, and
// Subscribe waits for that as for a new channel. A channel whose UNSUBSCRIBE
// was lost with its connection is forgotten, or subscribed again if a
// listener wants it, so no outage leaves a channel that looks subscribed but
// is not. On a cluster the same happens to a channel when Redis answers MOVED
// or drops it because its slot moved (an unsolicited SUNSUBSCRIBE).
//
// A connection can also fail without an error: a partition that keeps the
// TCP connection open but drops the bytes (a "black hole") loses the commands
// written into it, and no confirmation ever comes. The Hub therefore watches
// every connection (see watch.go): a command not confirmed within
// confirmWait, or a connection silent for keepalive, makes it send a PING
// tagged with a sequence number. Redis answers in order, so a PONG proves
// that every command written before its PING was processed: a command still
// unconfirmed then was lost, and the connection is replaced at once. A
// connection whose PINGs go unanswered for deadAfter is replaced too. While a
// partition lasts less than deadAfter, the connection is kept, so channels
// subscribed before it receive again the moment it heals; the ones whose
// commands were lost in it are confirmed on a fresh connection within about
// probeEvery of the heal.
//
// A listener that must know it missed nothing (a near cache dropping what
// other processes changed) watches its channel instead (Watch): it is given
// every message in order, on the connection's reader, and told each time the
// connection proves that every message published before then has reached it
// — a message, a PONG (the connection is PINGed when silent for the
// listener's interval), a confirmation — within a session, which a new
// subscription of the channel (after any loss) begins anew; a failed
// connection ends the session at once. A watched channel is a classic one,
// also on a cluster (PUBLISH reaches every node).
package wake

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

	mu      sync.Mutex               // guards the fields below and every channel's and conn's state
	conns   map[string]*conn         // by master address ("" when not a cluster)
	chans   map[string]*channel      // by channel name
	watches []*Sub                   // the listeners of watched channels (see Watch)
	backoff map[string]time.Duration // by address: the delay before the next connection after a failure
	closed  bool
	done    chan struct{} // closed by Close
	wg      sync.WaitGroup
}

// New returns a Hub on rdb. On a *redis.ClusterClient it uses shard channels
// (SSUBSCRIBE); otherwise plain SUBSCRIBE on one connection.
func New(rdb redis.UniversalClient) *Hub {
	h := &Hub{rdb: rdb, conns: map[string]*conn{}, chans: map[string]*channel{}, backoff: map[string]time.Duration{}, done: make(chan struct{})}
	h.cluster, _ = rdb.(*redis.ClusterClient)
	return h
}

// Sharded reports whether publishers must use SPUBLISH for this hub's channels.
func (h *Hub) Sharded() bool { return h.cluster != nil }

type state int

const (
	detached      state = iota // not sent on any connection yet (being attached)
	subscribing                // SUBSCRIBE sent (or to be sent once its connection is up), not confirmed
	subscribed                 // confirmed by Redis on the current connection
	unsubscribing              // UNSUBSCRIBE sent, not confirmed
)

type channel struct {
	name    string
	classic bool   // SUBSCRIBE, not SSUBSCRIBE, on a cluster too (a watched channel)
	session uint64 // counts the channel's confirmed subscriptions
	conn    *conn
	state   state
	again   bool          // a listener arrived while unsubscribing: subscribe again
	ready   chan struct{} // closed when the current subscription is confirmed; replaced when it ends
	failed  chan struct{} // closed when the first attach failed (err says why)
	err     error
	subs    map[*Sub]bool
	linger  *time.Timer // pending unsubscribe of an idle channel
	gen     uint64      // counts the commands sent for the channel (see conn.pending)
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

// Sub is one listener on one channel. Close it when done.
type Sub struct {
	h     *Hub
	ch    *channel
	msgs  chan string
	fn    func(payload string) // SubscribeFunc's, given the messages instead of msgs
	l     Listener             // a watching listener (see Watch), else nil
	every time.Duration        // Watch's interval
	once  sync.Once
}

// Listener watches a channel (see Watch). Its methods are called on the
// hub's goroutines and must not block.
type Listener interface {
	// Heard is given each message of the channel, in order.
	Heard(payload string)
	// Live says that every message published on the channel before now has
	// reached Heard since session began. A new session means the channel
	// was subscribed again and messages may have been lost between; session
	// 0, that the subscription is down.
	Live(session uint64)
}

// C delivers the channel's messages (nil for SubscribeFunc's Sub). It is
// buffered; when the listener falls behind, the oldest undelivered message is
// dropped (a wake-up is a hint).
func (s *Sub) C() <-chan string { return s.msgs }

// Close releases the listener; a channel left without listeners is
// unsubscribed after a short linger.
func (s *Sub) Close() { s.once.Do(func() { s.h.release(s) }) }

// Subscribe registers a listener on channel and returns once Redis has
// confirmed the subscription, or ctx ends (an error), or maxConfirm passes:
// then the listener is returned unconfirmed — the subscription completes when
// the connection recovers, and the waiter's fallback timer covers the gap.
func (h *Hub) Subscribe(ctx context.Context, name string) (*Sub, error) {
	return h.subscribe(ctx, name, nil)
}

// SubscribeFunc is Subscribe with f given each message of the channel, in
// order, instead of C: it is called on the hub's goroutine and must not
// block. A process whose many waiters share one channel subscribes once and
// routes each message to the waiter it names, instead of copying it to every
// waiter's Sub.
func (h *Hub) SubscribeFunc(ctx context.Context, name string, f func(payload string)) (*Sub, error) {
	return h.subscribe(ctx, name, f)
}

func (h *Hub) subscribe(ctx context.Context, name string, f func(string)) (*Sub, error) {
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
	s := &Sub{h: h, ch: ch, fn: f}
	if f == nil {
		s.msgs = make(chan string, 4)
	}
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

// Watch makes l hear every message of channel name (a classic channel, also
// on a cluster) and be told when it provably heard all of them (see
// Listener): the connection is PINGed whenever it has been silent for every,
// and each PONG proves that the messages published before its PING arrived.
// The channel stays subscribed, and is subscribed again after any loss,
// until the returned Sub is closed.
func (h *Hub) Watch(name string, l Listener, every time.Duration) (*Sub, error) {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil, ErrClosed
	}
	if h.chans[name] != nil {
		h.mu.Unlock()
		return nil, fmt.Errorf("wake: channel %q is subscribed already", name)
	}
	ch := &channel{name: name, classic: true, ready: make(chan struct{}), failed: make(chan struct{}), subs: map[*Sub]bool{}}
	h.chans[name] = ch
	s := &Sub{h: h, ch: ch, l: l, every: every}
	ch.subs[s] = true
	h.watches = append(h.watches, s)
	h.wg.Add(1)
	h.mu.Unlock()
	go func() {
		defer h.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), dialTimeout)
		err := h.attach(ctx, ch)
		cancel()
		if err != nil {
			h.reroute([]*channel{ch}, minBackoff)
		}
	}()
	return s, nil
}

// alive returns the listeners that c's latest receipt proves alive (h.mu
// held): those of watched channels confirmed on c.
func (h *Hub) alive(c *conn) []live {
	var ls []live
	for _, s := range h.watches {
		if ch := s.ch; ch.conn == c && !c.dead && ch.state == subscribed {
			ls = append(ls, live{s.l, ch.session})
		}
	}
	return ls
}

// live is a Listener to tell its session.
type live struct {
	l       Listener
	session uint64
}

func tell(ls []live) {
	for _, x := range ls {
		x.l.Live(x.session)
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
	h.forget(ch)
	ch.err = err
	close(ch.failed)
}

// forget drops ch from the hub (h.mu held).
func (h *Hub) forget(ch *channel) {
	if h.chans[ch.name] == ch {
		delete(h.chans, ch.name)
	}
	if ch.linger != nil {
		ch.linger.Stop()
		ch.linger = nil
	}
	if ch.conn != nil {
		delete(ch.conn.pending, ch)
	}
}

func (h *Hub) release(s *Sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := s.ch
	delete(ch.subs, s)
	if i := slices.Index(h.watches, s); i >= 0 {
		h.watches = slices.Delete(h.watches, i, i+1)
	}
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
	send := !h.closed && h.chans[ch.name] == ch && ch.linger != nil && ch.state == subscribed && len(ch.subs) == 0
	ch.linger = nil
	var gen uint64
	c := ch.conn
	if send {
		ch.state = unsubscribing
		ch.unconfirm()
		gen = h.expect(c, ch)
	}
	h.mu.Unlock()
	if send {
		h.write(context.Background(), c, ch, gen, "unsubscribe")
	}
}

// unsubscribed ends the unsubscription of ch on c, confirmed by Redis. A
// channel that got listeners meanwhile is subscribed again; otherwise it is
// forgotten.
func (h *Hub) unsubscribed(c *conn, ch *channel) {
	h.mu.Lock()
	if h.chans[ch.name] != ch || ch.conn != c || ch.state != unsubscribing {
		h.mu.Unlock()
		return
	}
	delete(c.pending, ch)
	resend := ch.again || len(ch.subs) > 0
	var gen uint64
	if resend {
		ch.again = false
		ch.state = subscribing
		gen = h.expect(c, ch)
	} else {
		h.forget(ch)
	}
	h.mu.Unlock()
	if resend {
		h.write(context.Background(), c, ch, gen, "subscribe")
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

// Listeners returns the number of listeners of channel name.
func (h *Hub) Listeners(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch := h.chans[name]; ch != nil {
		return len(ch.subs)
	}
	return 0
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
	var up []*conn
	for _, c := range h.conns {
		c.dead = true
		c.stop()
		if c.up {
			up = append(up, c)
		} // else its goroutine closes it when its attempt returns
	}
	h.conns = map[string]*conn{}
	h.mu.Unlock()
	for _, c := range up {
		_ = c.ps.Close() // closing: nothing to do about an error
	}
	h.wg.Wait()
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

func (h *Hub) confirm(c *conn, m *redis.Subscription) {
	h.mu.Lock()
	c.heard = time.Now()
	ch := h.chans[m.Channel]
	if ch == nil || ch.conn != c {
		ls := h.alive(c)
		h.mu.Unlock()
		tell(ls)
		return
	}
	var unsub, lost bool
	switch m.Kind {
	case "subscribe", "ssubscribe":
		if ch.state == subscribing {
			delete(c.pending, ch)
			ch.state = subscribed
			ch.session++
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
	ls := h.alive(c)
	h.mu.Unlock()
	tell(ls)
	switch {
	case unsub:
		h.unsubscribed(c, ch)
	case lost:
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			h.reroute([]*channel{ch}, minBackoff)
		}()
	}
}

func (h *Hub) deliver(c *conn, name, payload string) {
	h.mu.Lock()
	c.heard = time.Now()
	var heard []Listener
	var fnBuf [2]func(string)
	fns := fnBuf[:0]
	if ch := h.chans[name]; ch != nil {
		for s := range ch.subs {
			if s.fn != nil {
				fns = append(fns, s.fn)
				continue
			}
			if s.l != nil {
				if ch.conn == c && ch.state == subscribed {
					heard = append(heard, s.l)
				}
				continue
			}
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
	ls := h.alive(c)
	h.mu.Unlock()
	for _, f := range fns {
		f(payload)
	}
	for _, l := range heard {
		l.Heard(payload)
	}
	tell(ls)
}
