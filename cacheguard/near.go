package cacheguard

import (
	"context"
	"hash/maphash"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The near cache (see NearCache, and DESIGN.md, Near cache) hears on
// prefix+"nc" what every fill, Invalidate and InvalidateTags of every Guard
// publishes: "<origin> f<key>", "<origin> i<key>" or "<origin> t<tag>". It is
// trusted for nearTrust after each proof (Live) that the subscription heard
// every message; a new subscription moves the epoch (judge refuses every
// entry taken in before) and flushes it. A value enters only under a ticket
// taken before the command that produced it was sent.

const (
	nearProbe = 250 * time.Millisecond // the subscription is PINGed when silent this long
	nearTrust = time.Second            // trusted this long after the last proof
	nearSlots = 4096                   // change counters, by hash of key
)

// nearCache is the in-process tier. Reads never write shared memory: the map
// is a sync.Map (lock-free loads), entries are immutable, and the state a hit
// checks is one atomic word.
type nearCache struct {
	g    *Guard
	ttl  time.Duration
	base time.Time
	seed maphash.Seed

	m     sync.Map // cache key → *nearNode
	state atomic.Uint64
	// changes counts the messages heard per hash of key (and the local
	// drops); tagChanges those about any tag. A value enters only if the
	// counts its ticket took did not move. Each moves twice per drop: as it
	// begins (voiding the tickets taken before) and once it is done, so that
	// an even count is one whose drops are all applied (see NearHeard).
	changes    [nearSlots]atomic.Uint32
	tagChanges atomic.Uint64

	mu   sync.Mutex // guards ring, head, tags, session, down and the writes of state
	ring []*nearEntry
	head int
	// tags indexes the entries that carry each tag — only tags that an
	// entry in the ring carries.
	tags map[string]map[*nearEntry]struct{}
	// session is the subscription's session trusted last, down the last
	// one that ended (see Live).
	session, down uint64

	// gens keeps the newest generation seen of the keys that have, or had
	// lately, no node (none was near-cached, or their node went: evicted,
	// emptied): a node carries its key's generation only while it lives,
	// and a read of another representation answered late would put a
	// value older than one the process served already (see seen, put).
	// Bounded as the ring is, oldest first.
	gensMu   sync.Mutex
	gens     map[string]int64
	gensRing []string
	gensHead int
}

// The state word: the epoch (bits 40 up), which every loss of trust moves so
// that entries taken in before it are never served again, and until when the
// subscription is trusted (bits 0-39: ms since base).
const trustBits = 40

func packState(epoch uint64, until int64) uint64 {
	return epoch<<trustBits | uint64(until)&(1<<trustBits-1)
}
func unpackState(s uint64) (epoch uint64, until int64) {
	return s >> trustBits, int64(s & (1<<trustBits - 1))
}

// nearID tells a key's representations apart in the near cache: the type,
// the Variant and the tag set.
type nearID struct {
	typ     reflect.Type
	variant string
	tags    string
}

func (c *call[T]) nearID() nearID { return nearIDOf(c.typ, &c.cfg) }

func nearIDOf(typ reflect.Type, cfg *config) nearID {
	id := nearID{typ: typ, variant: cfg.variant}
	if cfg.tags != nil {
		id.tags = cfg.tags.key
	}
	return id
}

// nearNode holds a key's entries, one per representation; the slice is
// replaced, never changed in place. gen is the key's newest generation this
// process saw while the node lived — in a value read or stored, or a fill
// lease's answer — and every entry is of it (see seen): a read that finds a
// later generation than another representation's drops that one, so that no
// Get serves a value from before an invalidation that an earlier Get of the
// process followed, whatever its Variant, type or tags.
type nearNode struct {
	mu   sync.Mutex   // serialises writers
	gen  atomic.Int64 // written under mu
	reps atomic.Pointer[[]*nearEntry]
}

type nearEntry struct {
	key   string
	id    nearID
	val   any
	env   envelope // the header (no payload), with the epoch it entered under
	until int64    // ms since base: the near cache's own TTL
	tags  []string
}

// nearTicket is what a call remembers of the near cache before it sends the
// command whose answer may enter it.
type nearTicket struct {
	ok      bool // trusted then
	epoch   uint64
	slot    uint32
	changes uint32
	tags    uint64
}

// newNearCache returns a near cache that watches its channel through g's
// wake-up hub.
func newNearCache(g *Guard, max int, ttl time.Duration) *nearCache {
	n := &nearCache{
		g: g, ttl: ttl, base: time.Now(), seed: maphash.MakeSeed(),
		ring: make([]*nearEntry, max), tags: map[string]map[*nearEntry]struct{}{},
		gens: map[string]int64{}, gensRing: make([]string, max),
	}
	_, _ = g.hub.Watch(g.ncChannel, n, nearProbe) // a new hub is not closed; it keeps the watch
	return n
}

func (n *nearCache) mono(t time.Time) int64 { return int64(t.Sub(n.base) / time.Millisecond) }

func (n *nearCache) slot(key string) uint32 { return uint32(maphash.String(n.seed, key) % nearSlots) }

// get returns the near-cached entry of a representation and the epoch it is
// judged under, if the near cache is trusted at now. It allocates nothing.
func (n *nearCache) get(key string, id nearID, now time.Time) (*nearEntry, uint64) {
	epoch, until := unpackState(n.state.Load())
	mono := n.mono(now)
	if mono >= until {
		return nil, 0
	}
	if x, found := n.m.Load(key); found {
		if reps := x.(*nearNode).reps.Load(); reps != nil {
			gen := x.(*nearNode).gen.Load()
			for _, e := range *reps {
				if e.id == id && mono < e.until && e.env.gen >= gen {
					return e, epoch
				}
			}
		}
	}
	return nil, 0
}

// ticket remembers the state before a command that reads key is sent (none
// without a near cache).
func (n *nearCache) ticket(key string) nearTicket {
	if n == nil {
		return nearTicket{}
	}
	epoch, until := unpackState(n.state.Load())
	t := nearTicket{ok: n.mono(time.Now()) < until, epoch: epoch, slot: n.slot(key), tags: n.tagChanges.Load()}
	t.changes = n.changes[t.slot].Load()
	return t
}

// valid reports whether nothing was heard that voids what a command sent
// after t answered, and the subscription was trusted throughout.
func (n *nearCache) valid(t nearTicket, tagged bool) bool {
	epoch, until := unpackState(n.state.Load())
	return t.ok && epoch == t.epoch && n.mono(time.Now()) < until && n.changes[t.slot].Load() == t.changes &&
		(!tagged || n.tagChanges.Load() == t.tags)
}

// put keeps val, a fresh value of key that a command sent after t found in
// Redis (or that the call stored), unless something was heard about its key
// or tags since, or the subscription was not trusted throughout, or it is of
// an older generation than the key's newest seen; it drops the key's entries
// of older generations (see seen). With replace, the key's other
// representations are dropped (this process stored it: see call.fill).
func (n *nearCache) put(t nearTicket, key string, id nearID, tags []string, val any, env *envelope, replace bool) {
	now := time.Now()
	if env.negative || env.failSafe || now.UnixMilli() >= env.freshUntil || !n.valid(t, len(tags) > 0) {
		n.seen(key, env.gen)
		return
	}
	e := &nearEntry{key: key, id: id, val: val, env: *env, until: n.mono(now.Add(n.ttl)), tags: tags}
	e.env.payload, e.env.epoch = nil, t.epoch
	x, _ := n.m.LoadOrStore(key, &nearNode{})
	node := x.(*nearNode)
	node.mu.Lock()
	if !n.valid(t, len(tags) > 0) || env.gen < node.gen.Load() || env.gen < n.kept(key) {
		node.mu.Unlock()
		n.seen(key, env.gen)
		return
	}
	node.gen.Store(env.gen)
	var reps, gone []*nearEntry
	if old := node.reps.Load(); old != nil {
		for _, o := range *old {
			if o.id == id || replace || o.env.gen < env.gen {
				gone = append(gone, o)
			} else {
				reps = append(reps, o)
			}
		}
	}
	reps = append(reps, e)
	node.reps.Store(&reps)
	node.mu.Unlock()
	n.admit(e, gone)
	if len(tags) > 0 && n.tagChanges.Load() != t.tags {
		n.remove(e) // a tag message came while it was indexed: it may have missed it
	}
}

// seen records that gen is, or was, key's generation (a value of it was read,
// pushed or stored, or a fill lease's answer named it): the key's entries of
// older generations are dropped, and none enters again (see put). The one
// rule by which an invalidation that a call followed reaches the
// representations it did not read, before the invalidation's message does.
// When no entry is left, the node goes, and the reads of key in flight keep
// what they find out (as after drop): the generation goes with the node.
func (n *nearCache) seen(key string, gen int64) {
	if n == nil || gen == 0 {
		return
	}
	x, ok := n.m.Load(key)
	if !ok {
		// Nothing near-cached: nothing older to drop, but a put that
		// creates the node from now on refuses what is older (see gens).
		n.keep(key, gen)
		if x, ok = n.m.Load(key); !ok {
			return
		}
	}
	node := x.(*nearNode)
	node.mu.Lock()
	if gen <= node.gen.Load() {
		node.mu.Unlock()
		return
	}
	c := &n.changes[n.slot(key)]
	c.Add(1)
	defer c.Add(1)
	node.gen.Store(gen) // first: a get that loaded the entries already refuses them
	var reps, gone []*nearEntry
	if old := node.reps.Load(); old != nil {
		for _, o := range *old {
			if o.env.gen < gen {
				gone = append(gone, o)
			} else {
				reps = append(reps, o)
			}
		}
	}
	if len(reps) == 0 {
		n.keep(key, gen) // the generation outlives the node
		n.m.CompareAndDelete(key, node)
		node.reps.Store(nil)
	} else {
		node.reps.Store(&reps)
	}
	node.mu.Unlock()
	if len(gone) > 0 {
		n.mu.Lock()
		n.unindex(gone...)
		n.mu.Unlock()
	}
}

// keep records gen as key's newest generation seen, for when key has no
// node (see gens).
func (n *nearCache) keep(key string, gen int64) {
	n.gensMu.Lock()
	defer n.gensMu.Unlock()
	if old, ok := n.gens[key]; ok {
		n.gens[key] = max(old, gen)
		return
	}
	if k := n.gensRing[n.gensHead]; k != "" {
		delete(n.gens, k)
	}
	n.gensRing[n.gensHead] = key
	n.gensHead = (n.gensHead + 1) % len(n.gensRing)
	n.gens[key] = gen
}

// kept returns the generation keep recorded for key (0: none).
func (n *nearCache) kept(key string) int64 {
	n.gensMu.Lock()
	defer n.gensMu.Unlock()
	return n.gens[key]
}

// admit records e in insertion order — the ring holds every entry taken in,
// so at most its size are present — and evicts the entry it replaces there if
// still present; it unindexes gone, the entries e replaced.
func (n *nearCache) admit(e *nearEntry, gone []*nearEntry) {
	n.mu.Lock()
	old := n.ring[n.head]
	n.ring[n.head] = e
	n.head = (n.head + 1) % len(n.ring)
	for _, t := range e.tags {
		if n.tags[t] == nil {
			n.tags[t] = map[*nearEntry]struct{}{}
		}
		n.tags[t][e] = struct{}{}
	}
	n.unindex(gone...)
	n.mu.Unlock()
	if old != nil {
		n.remove(old)
	}
}

// unindex forgets es in the tag index (n.mu held).
func (n *nearCache) unindex(es ...*nearEntry) {
	for _, e := range es {
		for _, t := range e.tags {
			delete(n.tags[t], e)
			if len(n.tags[t]) == 0 {
				delete(n.tags, t)
			}
		}
	}
}

// remove drops e if it is still present.
func (n *nearCache) remove(e *nearEntry) {
	if x, ok := n.m.Load(e.key); ok {
		node := x.(*nearNode)
		node.mu.Lock()
		if old := node.reps.Load(); old != nil {
			reps := slices.DeleteFunc(slices.Clone(*old), func(o *nearEntry) bool { return o == e })
			if len(reps) == 0 {
				n.keep(e.key, node.gen.Load()) // the generation outlives the node
				n.m.CompareAndDelete(e.key, node)
				node.reps.Store(nil)
			} else {
				node.reps.Store(&reps)
			}
		}
		node.mu.Unlock()
	}
	if len(e.tags) > 0 {
		n.mu.Lock()
		n.unindex(e)
		n.mu.Unlock()
	}
}

// drop forgets every representation of key and makes the reads of key in
// flight keep what they find out of the near cache.
func (n *nearCache) drop(key string) {
	c := &n.changes[n.slot(key)]
	c.Add(1)
	defer c.Add(1)
	if x, ok := n.m.LoadAndDelete(key); ok {
		node := x.(*nearNode)
		if reps := node.reps.Swap(nil); reps != nil {
			n.mu.Lock()
			n.unindex(*reps...)
			n.mu.Unlock()
		}
	}
}

// dropTags forgets every entry carrying one of tags, and makes every read of
// a tagged value in flight keep what it finds out of the near cache.
func (n *nearCache) dropTags(tags []string) {
	n.tagChanges.Add(1)
	defer n.tagChanges.Add(1)
	var es []*nearEntry
	n.mu.Lock()
	for _, t := range tags {
		es = slices.AppendSeq(es, maps.Keys(n.tags[t]))
	}
	n.mu.Unlock()
	for _, e := range es {
		n.remove(e)
	}
}

// flush forgets everything (the epoch has moved: nothing older is served;
// n.mu held).
func (n *nearCache) flush() {
	n.m.Clear()
	clear(n.ring)
	n.head = 0
	clear(n.tags)
}

// Heard handles a message of the near-cache channel (see wake.Listener).
func (n *nearCache) Heard(payload string) {
	origin, body, ok := strings.Cut(payload, " ")
	if !ok || body == "" || origin == n.g.origin {
		return // this Guard applied its own news before publishing it
	}
	switch body[0] {
	case 'f', 'i':
		n.drop(body[1:])
		n.g.note(context.Background(), EventNearInvalidated, body[1:], 0, nil)
	case 't':
		n.dropTags([]string{body[1:]})
	}
}

// Live records a proof that the subscription heard every message published
// before now within session (see wake.Listener): the near cache is trusted
// until now+nearTrust. A new session (the channel subscribed again: messages
// may have been lost) moves the epoch and flushes first; session 0 (the
// subscription is down) ends the trust at once, and that session is never
// trusted again.
func (n *nearCache) Live(session uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case session == 0:
		n.down = n.session
		n.setTrust(0, true)
	case session > n.down:
		n.setTrust(n.mono(time.Now().Add(nearTrust)), session != n.session)
		n.session = session
	}
}

// setTrust sets until when the near cache is trusted; with flush (or after a
// lapse) the epoch moves first and everything is forgotten (n.mu held).
func (n *nearCache) setTrust(until int64, flush bool) {
	epoch, old := unpackState(n.state.Load())
	if flush || n.mono(time.Now()) >= old {
		epoch++
		flush = true
	}
	n.state.Store(packState(epoch, until))
	if flush {
		n.flush()
	}
}
