package cacheguard

import (
	"context"
	"time"
)

// NearLen is the number of entries in g's near cache.
func NearLen(g *Guard) int {
	n := 0
	g.near.m.Range(func(_, v any) bool {
		if reps := v.(*nearNode).reps.Load(); reps != nil {
			n += len(*reps)
		}
		return true
	})
	return n
}

// NearTrusted reports whether g's near cache is subscribed and trusted now.
func NearTrusted(g *Guard) bool {
	_, until := unpackState(g.near.state.Load())
	return g.near.mono(time.Now()) < until
}

// NearHeard counts the messages g's near cache applied that concern key (and
// the keys that share its counter): a message counted here no longer
// serves what it voided.
func NearHeard(g *Guard, key string) uint64 {
	if g.near == nil {
		return 0
	}
	return uint64(g.near.changes[g.near.slot(key)].Load() / 2)
}

// NearTags is the number of tags g's near cache keeps state for.
func NearTags(g *Guard) int {
	g.near.mu.Lock()
	defer g.near.mu.Unlock()
	return len(g.near.tags)
}

// NearHeardTags counts the tag messages g's near cache applied.
func NearHeardTags(g *Guard) uint64 {
	if g.near == nil {
		return 0
	}
	return g.near.tagChanges.Load() / 2
}

// SetHitsDirect sets how many hit reads of g may be on the wire on their own
// at once (see hits): the generator's processes allow one, so that the few
// calls a process runs at once share round trips.
func SetHitsDirect(g *Guard, n int) { g.hits.direct = n }

// LeaseScriptSHA is the SHA1 of the get-or-lease script (lease.lua).
func LeaseScriptSHA() string { return leaseScript.SHA() }

// LeaseScriptSource is the source of the get-or-lease script, as EVAL sends it.
func LeaseScriptSource() string { return leaseScript.Source() }

// IsReleaseCall reports whether the command line a runs the fill lease's
// release script (release.lua), as EVALSHA or as the EVAL after a NOSCRIPT.
func IsReleaseCall(a []any) bool {
	return len(a) > 1 && (a[0] == "evalsha" && a[1] == releaseScript.SHA() || a[0] == "eval" && a[1] == releaseScript.Source())
}

// LoadsWaiting is how many loads of g wait for a slot (MaxConcurrentLoads).
func LoadsWaiting(g *Guard) int { return g.slots.waiting() }

// Promoted is how many loads of g waiting for a slot a loader's Get let run
// without one (see loadSlots.promote).
func Promoted(g *Guard) int64 {
	if g.slots == nil {
		return 0
	}
	return g.slots.promotions.Load()
}

// ReadsQueued is how many calls of g wait for a read queued behind one in
// flight (see Guard.readOne).
func ReadsQueued(g *Guard) int {
	g.reads.mu.Lock()
	defer g.reads.mu.Unlock()
	n := 0
	for _, l := range g.reads.m {
		if l.next != nil {
			n += l.next.waiting
		}
	}
	return n
}

// IsFillCall reports whether the command line a runs the fill script
// (fill.lua), as EVALSHA or as the EVAL after a NOSCRIPT.
func IsFillCall(a []any) bool {
	return len(a) > 1 && (a[0] == "evalsha" && a[1] == fillScript.SHA() || a[0] == "eval" && a[1] == fillScript.Source())
}

// OpenStores is how many flights of g have a store calls may wait for (see
// call.awaitFill): 0 once every fill sent its store.
func (g *Guard) OpenStores() int64 { return g.flights.open.Load() }

// SetReadLimit sets how many reads of one entry g sends at once (see
// Guard.readOne); the calls beyond them queue behind.
func SetReadLimit(g *Guard, n int) { g.reads.limit = n }

// TrustNear makes g's near cache trusted for d from now, as a proof of its
// subscription would: a test that holds the subscription's replies (a late
// message) keeps it trusted meanwhile, until the hub gives the connection up.
func TrustNear(g *Guard, d time.Duration) {
	n := g.near
	n.mu.Lock()
	defer n.mu.Unlock()
	epoch, _ := unpackState(n.state.Load())
	n.state.Store(packState(epoch, n.mono(time.Now().Add(d))))
}

// HoldWake subscribes g to key's wake-up channel, as a flight of g waiting
// for another fill of key (of any representation) would, until release: a
// push on it then reaches g whatever g's own flights do.
func HoldWake(g *Guard, key string) (release func(), err error) {
	ctx, cancel := context.WithTimeout(context.Background(), subscribeTimeout)
	defer cancel()
	sub, err := g.hub.Subscribe(ctx, g.names(key, "").wake)
	if err != nil {
		return nil, err
	}
	return func() { sub.Close() }, nil
}
