package cacheguard

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// Result says how one Get was served (see ReportTo).
type Result int

// How a Get was served. The zero Result means the call failed before reading
// the cache.
const (
	Hit       Result = iota + 1 // a fresh cached value (or a cached absence: ErrNotFound)
	Miss                        // this call ran the loader, or failed after finding nothing usable
	Stale                       // a stale value within its stale window; a refresh runs in the background
	Coalesced                   // a value loaded by another caller, in this process or another
	NearHit                     // a fresh value from this process's near cache (NearCache), Redis not asked
)

var resultNames = [...]string{"NONE", "HIT", "MISS", "STALE", "COALESCED", "NEAR_HIT"}

func (r Result) String() string {
	if r > 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return "NONE"
}

// EventKind names an outcome reported to an observer and counted in Stats.
type EventKind int

// Outcomes.
const (
	EventHit             EventKind = iota + 1 // a call found a fresh value (a cached absence included)
	EventMiss                                 // a call found no fresh value it could serve (one handed to a flight with others: reported when it wakes)
	EventLoad                                 // the loader ran (Event.Duration, Event.Err), unless it declined (ErrClosed)
	EventCoalescedLocal                       // a call shared a flight started by another caller of this process
	EventCoalescedRemote                      // a flight received a value another process loaded
	EventStale                                // a call was served a stale value
	EventEarlyRefresh                         // an early refresh (see EarlyRefresh) took the fill lease
	EventNegativeHit                          // a call found a cached absence
	EventWaitTimeout                          // a call's wait budget ended
	EventFailOpen                             // the loader ran because Redis could not be reached (Event.Err: the Redis error)
	EventDecodeError                          // cached bytes were not a valid envelope or payload (Event.Err)
	EventRedisError                           // a Redis call failed (Event.Err)
	EventNearHit                              // a hit served from the near cache (counted as EventHit too)
	EventFailSafe                             // an older value stood in for a failed or slow load (FailSafe, SoftTimeout)
	EventNearInvalidated                      // the near cache dropped a key on another process's message (an invalidation, a newer value); not for tags
	numKinds
)

var kindNames = [numKinds]string{"", "hit", "miss", "load", "coalesced_local", "coalesced_remote",
	"stale", "early_refresh", "negative_hit", "wait_timeout", "fail_open", "decode_error", "redis_error", "near_hit", "fail_safe", "near_invalidated"}

func (k EventKind) String() string {
	if k > 0 && k < numKinds {
		return kindNames[k]
	}
	return "unknown"
}

// Event is one outcome.
type Event struct {
	Kind     EventKind
	Key      string        // the caller's key
	Duration time.Duration // the load's duration (EventLoad)
	Err      error         // the cause, where there is one
}

// Stats are a Guard's counters since New.
type Stats struct {
	Hits            uint64 // calls served a fresh value, cached absences included
	Misses          uint64 // calls that found no fresh value they could serve
	Loads           uint64 // loader runs, of every kind (not those that declined: see ErrClosed)
	CoalescedLocal  uint64 // calls that shared a flight started by another caller of this process
	CoalescedRemote uint64 // flights (one per process and fill) served by another process's load
	StaleServed     uint64 // calls served a stale value
	EarlyRefreshes  uint64 // background refreshes started by probabilistic early refresh
	NegativeHits    uint64 // calls served a cached absence (ErrNotFound)
	WaitTimeouts    uint64 // calls whose wait budget ended
	FailOpenLoads   uint64 // loads run because Redis could not be reached
	DecodeErrors    uint64 // cached values that could not be decoded (treated as misses)
	RedisErrors     uint64 // failed Redis calls
	NearHits        uint64 // hits served from the near cache (counted in Hits too)
	FailSafe        uint64 // calls served an older value for a failed or slow load
	// NearInvalidations counts the keys the near cache dropped on another
	// process's message (EventNearInvalidated).
	NearInvalidations uint64
}

type counters struct {
	c [numKinds]atomic.Uint64
	// near counts the near cache's hits, spread over padded cells so that
	// the cores serving them do not all write one cache line.
	near [16]struct {
		n atomic.Uint64
		_ [56]byte
	}
}

func (c *counters) add(kind EventKind) {
	if kind == EventNearHit {
		c.near[rand.Uint32()%uint32(len(c.near))].n.Add(1)
		return
	}
	c.c[kind].Add(1)
}

// snapshot returns the counters as Stats, a near hit counted as a hit too.
func (c *counters) snapshot() (s Stats) {
	for k, p := range [numKinds]*uint64{nil, &s.Hits, &s.Misses, &s.Loads, &s.CoalescedLocal, &s.CoalescedRemote, &s.StaleServed,
		&s.EarlyRefreshes, &s.NegativeHits, &s.WaitTimeouts, &s.FailOpenLoads, &s.DecodeErrors, &s.RedisErrors, &s.NearHits, &s.FailSafe, &s.NearInvalidations} {
		if p != nil {
			*p = c.c[k].Load()
		}
	}
	for i := range c.near {
		s.NearHits += c.near[i].n.Load()
	}
	s.Hits += s.NearHits
	return s
}

// observe tells the observer of an outcome counted already.
func (g *Guard) observe(ctx context.Context, kind EventKind, key string) {
	if g.cfg.observer != nil {
		g.tell(ctx, Event{Kind: kind, Key: key})
	}
}

// tell calls the observer with e: every call to it goes through here. A panic
// in it is the user's code failing, not the Guard's: it is logged and
// recovered, so that the fill, the read or the subscription that reported e
// goes on (releases its lease, wakes its waiters, survives).
func (g *Guard) tell(ctx context.Context, e Event) {
	defer func() {
		if p := recover(); p != nil {
			g.log.Warn(ctx, "observer_panic", "cacheguard: the Observer panicked (recovered)",
				slog.String("event", e.Kind.String()), slog.String("key", e.Key), slog.Any("panic", p))
		}
	}()
	g.cfg.observer(ctx, e)
}

// note counts an outcome, tells the observer (a near-cache hit as EventHit,
// then EventNearHit), and logs the warnings.
func (g *Guard) note(ctx context.Context, kind EventKind, key string, d time.Duration, err error) {
	g.stats.add(kind)
	if g.cfg.observer != nil {
		if kind == EventNearHit {
			g.tell(ctx, Event{Kind: EventHit, Key: key})
		}
		g.tell(ctx, Event{Kind: kind, Key: key, Duration: d, Err: err})
	}
	switch kind {
	case EventFailOpen:
		g.log.Warn(ctx, "fail_open", "cacheguard: Redis unreachable, the loader ran uncached (fail-open)", slog.String("key", key), slog.Any("error", err))
	case EventRedisError:
		g.log.Warn(ctx, "redis_error", "cacheguard: a Redis call failed", slog.String("key", key), slog.Any("error", err))
	case EventDecodeError:
		g.log.Warn(ctx, "decode_error", "cacheguard: a cached value could not be decoded (treated as a miss)", slog.String("key", key), slog.Any("error", err))
	}
}
