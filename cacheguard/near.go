package cacheguard

import (
	"context"
	"errors"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// The near cache (see NearCache) keeps decoded values in the process, in
// front of Redis. Its entries are dropped in every process through one
// pub/sub channel per prefix (prefix+"nc"), on which every fill, Invalidate
// and InvalidateTags of every Guard publishes — whether it has a near cache or
// not — "<origin> f<key>", "<origin> i<key>" or "<origin> t<tag>". The
// channel is a classic one even on a Redis Cluster, where a PUBLISH reaches
// every node over the cluster bus: each fill and invalidation costs one
// message per node there, whatever the number of subscribers.
//
// An entry is served only while its process can trust that it heard every
// message: the subscription's connection answers a PING every nearProbe, and
// a connection silent for nearTrust (lost, black-holed, reconnecting) makes
// the near cache bypassed until it answers again — and flushed then, since
// messages may have been lost meanwhile. A value enters only if nothing was
// heard about its key (or its tags) between the start of the read that found
// it and its insertion, and only while trusted.

const (
	nearProbe   = 250 * time.Millisecond // PING on the subscription this often
	nearTrust   = time.Second            // trusted this long after the last sign of life
	nearRetry   = 100 * time.Millisecond // first delay before subscribing again after a failure
	nearSlots   = 4096                   // change counters, by hash of key
	nearMaxTags = 16                     // tags a near-cached value may carry
)

// nearCache is the in-process tier. Reads never write shared memory: the map
// is a sync.Map (lock-free loads), entries are immutable, and the state a hit
// checks is one atomic word.
type nearCache struct {
	g       *Guard
	max     int64
	ttl     time.Duration
	channel string
	origin  string // this Guard's name in messages
	base    time.Time
	seed    maphash.Seed

	m     sync.Map     // cache key → *nearNode
	n     atomic.Int64 // entries
	state atomic.Uint64
	// changes counts the messages heard per hash of key (and the local
	// invalidations): a read remembers its key's count, and its value enters
	// only if the count did not move.
	changes [nearSlots]atomic.Uint32
	tags    sync.Map // tag → *atomic.Uint64: messages heard for the tag

	mu   sync.Mutex // guards ring and head
	ring []nearSlot // insertion order, for eviction (first in, first out)
	head int

	quit chan struct{}
	done chan struct{}
}

// The state word: the epoch (bits 40 up), which every loss of trust moves so
// that entries inserted before it are never served again, and until when the
// subscription is trusted (bits 0-39: ms since base).
const trustBits = 40

func packState(epoch uint64, until int64) uint64 {
	return epoch<<trustBits | uint64(until)&(1<<trustBits-1)
}
func unpackState(s uint64) (epoch uint64, until int64) {
	return s >> trustBits, int64(s & (1<<trustBits - 1))
}

type nearSlot struct {
	key   string
	entry *nearEntry
}

// nearNode holds a key's entries, one per representation; the slice is
// replaced, never changed in place.
type nearNode struct {
	mu   sync.Mutex // serialises writers
	reps atomic.Pointer[[]*nearEntry]
}

type nearEntry struct {
	typ        reflect.Type
	variant    string
	val        any
	freshUntil int64 // unix ms
	delta      time.Duration
	gen        int64
	until      int64  // ms since base: the near cache's own TTL
	epoch      uint64 // the state's epoch when it entered
	tags       []string
	tagSeen    []uint64 // the tags' counts when its read began
}

// nearSnap is what a call remembers of the near cache when its read began.
type nearSnap struct {
	ok      bool // trusted then
	epoch   uint64
	slot    uint32
	changes uint32
	tagSeen []uint64
}

func newNearCache(g *Guard, max int, ttl time.Duration) *nearCache {
	n := &nearCache{
		g: g, max: int64(max), ttl: ttl, channel: g.cfg.prefix + "nc", origin: g.origin,
		base: time.Now(), seed: maphash.MakeSeed(), ring: make([]nearSlot, max),
		quit: make(chan struct{}), done: make(chan struct{}),
	}
	go n.run()
	return n
}

func (n *nearCache) close() {
	close(n.quit)
	<-n.done
}

func (n *nearCache) mono(t time.Time) int64 { return int64(t.Sub(n.base) / time.Millisecond) }

func (n *nearCache) slot(key string) uint32 { return uint32(maphash.String(n.seed, key) % nearSlots) }

// get returns the near-cached value of a representation, fresh at now, if
// there is one that can be trusted. It allocates nothing.
func nearGet[T any](n *nearCache, key string, typ reflect.Type, variant string, tags []string, now time.Time) (v T, e *nearEntry, ok bool) {
	epoch, until := unpackState(n.state.Load())
	mono := n.mono(now)
	if mono >= until {
		return v, nil, false
	}
	x, found := n.m.Load(key)
	if !found {
		return v, nil, false
	}
	reps := x.(*nearNode).reps.Load()
	if reps == nil {
		return v, nil, false
	}
	for _, e := range *reps {
		if e.typ != typ || e.variant != variant {
			continue
		}
		if e.epoch != epoch || mono >= e.until || now.UnixMilli() >= e.freshUntil || !n.sameTags(e, tags) {
			return v, nil, false
		}
		v, ok = e.val.(T)
		return v, e, ok
	}
	return v, nil, false
}

// sameTags reports whether e carries exactly tags and none of them was
// invalidated since e's read began.
func (n *nearCache) sameTags(e *nearEntry, tags []string) bool {
	if len(e.tags) != len(tags) {
		return false
	}
	for i, t := range tags {
		if e.tags[i] != t || n.tagCount(t) != e.tagSeen[i] {
			return false
		}
	}
	return true
}

func (n *nearCache) tagCount(tag string) uint64 {
	if c, ok := n.tags.Load(tag); ok {
		return c.(*atomic.Uint64).Load()
	}
	return 0
}

// snap remembers the state a read of key begins under.
func (n *nearCache) snap(key string, tags []string, now time.Time) nearSnap {
	epoch, until := unpackState(n.state.Load())
	s := nearSnap{ok: n.mono(now) < until && len(tags) <= nearMaxTags, epoch: epoch, slot: n.slot(key)}
	s.changes = n.changes[s.slot].Load()
	if len(tags) > 0 {
		s.tagSeen = make([]uint64, len(tags))
		for i, t := range tags {
			s.tagSeen[i] = n.tagCount(t)
		}
	}
	return s
}

// put keeps a value that a read begun under s found fresh in Redis (or that
// the call loaded and stored), unless something was heard about its key or
// tags since, or the subscription was not trusted throughout.
func (n *nearCache) put(s nearSnap, key string, typ reflect.Type, variant string, tags []string, val any, env *envelope) {
	now := time.Now()
	if !s.ok || env == nil || env.negative || now.UnixMilli() >= env.freshUntil {
		return
	}
	e := &nearEntry{typ: typ, variant: variant, val: val, freshUntil: env.freshUntil, delta: env.delta, gen: env.gen,
		until: n.mono(now.Add(n.ttl)), epoch: s.epoch, tags: tags, tagSeen: s.tagSeen}
	x, _ := n.m.LoadOrStore(key, &nearNode{})
	node := x.(*nearNode)
	node.mu.Lock()
	if epoch, until := unpackState(n.state.Load()); epoch != s.epoch || n.mono(now) >= until ||
		n.changes[s.slot].Load() != s.changes || !n.sameTags(e, tags) {
		node.mu.Unlock()
		return
	}
	old := node.reps.Load()
	var reps []*nearEntry
	replaced := false
	if old != nil {
		reps = make([]*nearEntry, 0, len(*old)+1)
		for _, o := range *old {
			if o.typ == typ && o.variant == variant {
				reps = append(reps, e)
				replaced = true
			} else {
				reps = append(reps, o)
			}
		}
	}
	if !replaced {
		reps = append(reps, e)
	}
	node.reps.Store(&reps)
	node.mu.Unlock()
	if !replaced {
		n.admit(key, e)
	}
}

// admit records e in insertion order and, when the near cache is full,
// evicts the oldest entry still present.
func (n *nearCache) admit(key string, e *nearEntry) {
	n.mu.Lock()
	old := n.ring[n.head]
	n.ring[n.head] = nearSlot{key: key, entry: e}
	n.head = (n.head + 1) % len(n.ring)
	n.mu.Unlock()
	if old.entry == nil {
		n.n.Add(1)
		return
	}
	n.evict(old.key, old.entry)
}

// evict removes entry e of key if it is still there.
func (n *nearCache) evict(key string, e *nearEntry) {
	x, ok := n.m.Load(key)
	if !ok {
		return
	}
	node := x.(*nearNode)
	node.mu.Lock()
	defer node.mu.Unlock()
	old := node.reps.Load()
	if old == nil {
		return
	}
	reps := make([]*nearEntry, 0, len(*old))
	for _, o := range *old {
		if o != e {
			reps = append(reps, o)
		}
	}
	if len(reps) == 0 {
		n.m.CompareAndDelete(key, node)
		node.reps.Store(nil)
		return
	}
	node.reps.Store(&reps)
}

// drop forgets every representation of key and makes the reads of key in
// flight keep what they find out of the near cache.
func (n *nearCache) drop(key string) {
	n.changes[n.slot(key)].Add(1)
	if x, ok := n.m.LoadAndDelete(key); ok {
		x.(*nearNode).reps.Store(nil)
	}
}

// dropTag makes every entry carrying tag, and every read of a tagged value in
// flight, miss the near cache.
func (n *nearCache) dropTag(tag string) {
	c, _ := n.tags.LoadOrStore(tag, new(atomic.Uint64))
	c.(*atomic.Uint64).Add(1)
}

// flush forgets everything (the epoch has moved: nothing older is served).
func (n *nearCache) flush() {
	n.m.Range(func(k, _ any) bool {
		n.m.Delete(k)
		return true
	})
	n.mu.Lock()
	clear(n.ring)
	n.head = 0
	n.mu.Unlock()
	n.n.Store(0)
}

// trust records a sign of life of the subscription at now: the near cache is
// trusted until now+nearTrust. After a lapse (or with fresh, a new
// subscription) the epoch moves first, so nothing inserted before is served.
func (n *nearCache) trust(now time.Time, fresh bool) {
	for {
		s := n.state.Load()
		epoch, until := unpackState(s)
		mono := n.mono(now)
		lapsed := mono >= until
		if lapsed || fresh {
			epoch++
		}
		if n.state.CompareAndSwap(s, packState(epoch, mono+int64(nearTrust/time.Millisecond))) {
			if lapsed || fresh {
				n.flush()
			}
			return
		}
	}
}

// distrust ends the trust at once (the subscription failed).
func (n *nearCache) distrust() {
	for {
		s := n.state.Load()
		epoch, _ := unpackState(s)
		if n.state.CompareAndSwap(s, packState(epoch+1, 0)) {
			n.flush()
			return
		}
	}
}

// heard handles a message of the near-cache channel.
func (n *nearCache) heard(payload string) {
	origin, body, ok := strings.Cut(payload, " ")
	if !ok || body == "" || origin == n.origin {
		return // this Guard applied its own news before publishing it
	}
	switch body[0] {
	case 'f', 'i':
		n.drop(body[1:])
	case 't':
		n.dropTag(body[1:])
	}
}

// run keeps the subscription to the near-cache channel and its trust: it
// PINGs every nearProbe, and takes every message, PONG and confirmation as a
// sign of life (Redis answers on a connection in order, so a PONG means every
// message published before the PING reached this process).
func (n *nearCache) run() {
	defer close(n.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.quit:
		case <-n.done:
		}
		cancel()
	}()
	backoff := nearRetry
	for ctx.Err() == nil {
		if n.listen(ctx) {
			backoff = nearRetry
		}
		n.distrust()
		t := time.NewTimer(backoff + rand.N(backoff/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// listen runs one subscription until it fails or ctx ends; it reports
// whether the subscription was confirmed.
func (n *nearCache) listen(ctx context.Context) (confirmed bool) {
	ps := n.g.rdb.Subscribe(ctx, n.channel)
	defer func() { _ = ps.Close() }()
	lastLife := time.Now()
	pinged := false
	for ctx.Err() == nil {
		msg, err := ps.ReceiveTimeout(ctx, nearProbe)
		now := time.Now()
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" {
				confirmed = true
				n.trust(now, true)
				lastLife, pinged = now, false
			}
			continue
		case *redis.Message:
			n.heard(m.Payload)
		case *redis.Pong:
		default:
			if err == nil {
				continue
			}
			if !isTimeout(err) {
				return confirmed
			}
			if now.Sub(lastLife) >= nearTrust {
				return confirmed // silent: lost or black-holed
			}
			if !pinged || now.Sub(lastLife) >= nearProbe {
				if err := ps.Ping(ctx, "nc"); err != nil {
					return confirmed
				}
				pinged = true
			}
			continue
		}
		if confirmed {
			n.trust(now, false)
		}
		lastLife, pinged = now, false
	}
	return confirmed
}

// isTimeout reports a read timeout (nothing arrived).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// nearXFetch is xfetch for a near-cached entry.
func nearXFetch(now time.Time, e *nearEntry, beta float64, ttl time.Duration) bool {
	if beta <= 0 || e.delta <= 0 {
		return false
	}
	gap := -float64(e.delta.Microseconds()) / 1000 * beta * math.Log(rand.Float64())
	gap = min(gap, float64(ttl.Milliseconds())/earlyRefreshShare)
	return float64(now.UnixMilli())+gap >= float64(e.freshUntil)
}
