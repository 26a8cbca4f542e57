package cacheguard

import (
	"math"
	"math/rand/v2"
	"time"
)

// A verdict is what a call may do with a value it found.
type verdict uint8

const (
	// refused: the value may never be served to the call — loaded under an
	// older generation or older versions of its tags than the call knows,
	// or taken in by the near cache before its last loss of trust — and is
	// to be replaced even if its header says fresh.
	refused verdict = iota
	// expired: not servable now; it may still stand in for a failed or
	// slow load (FailSafe, SoftTimeout).
	expired
	// gone: too old for anything.
	gone
	// The verdicts below serve the value; those above do not.
	fresh    // served as it is (a cached absence: ErrNotFound)
	stale    // served marked Stale while one refresh runs (ServeStale, FailFast)
	failSafe // an older value re-stored after a failed load, in its back-off: served marked Stale
)

// view is what a call knows when it judges a value: its clock, and the state
// of the key it read after it began.
type view struct {
	now  int64 // unix ms
	gen  int64 // the key's generation as read after the call began; 0 when not read
	tags []uint64
	// epoch is the near cache's epoch when the call looked there (see
	// nearCache); values from Redis carry none and are judged with 0.
	epoch uint64
}

// judge is the one place that decides whether a value may be served to a
// call: a value read from Redis, found in the near cache, pushed by another
// process's fill, returned by a flight the call joined, or kept as a
// fallback for a failed load. Every path asks it.
func (c *config) judge(e *envelope, v *view) verdict {
	switch {
	case e.gen < v.gen, e.epoch != v.epoch, !c.tags.current(e, v.tags):
		return refused
	case v.now < e.freshUntil && e.failSafe:
		return failSafe
	case v.now < e.freshUntil:
		return fresh
	case e.negative:
		return gone
	case v.now < e.staleUntil && c.policy != policyWait:
		return stale
	case v.now < e.staleUntil:
		return expired
	case !e.failSafe && c.failSafeAge > 0 && v.now < e.freshUntil+c.failSafeAge.Milliseconds():
		return expired // a fail-safe value keeps its first deadline, in stale-until
	}
	return gone
}

// earlyRefreshShare is the share of the TTL, at its end, within which an
// early refresh may start (see EarlyRefresh).
const earlyRefreshShare = 20 // the last 1/20

// xfetch decides a probabilistic early refresh of a fresh value at now (unix
// ms): now − Δ·β·ln(rand) ≥ fresh-until, the gap Δ·β·ln(rand) capped at
// ttl/earlyRefreshShare.
func (c *config) xfetch(now int64, e *envelope) bool {
	if c.beta <= 0 || e.delta <= 0 || e.failSafe || e.negative {
		return false
	}
	gap := -float64(e.delta.Microseconds()) / 1000 * c.beta * math.Log(rand.Float64())
	gap = min(gap, float64(c.ttl.Milliseconds())/earlyRefreshShare)
	return float64(now)+gap >= float64(e.freshUntil)
}

// keep is how long a value fresh for fresh is kept in Redis: its stale
// window, or FailSafe's max age, past fresh-until.
func (c *config) keep(fresh time.Duration) time.Duration {
	return fresh + max(c.staleWindow, c.failSafeAge)
}
