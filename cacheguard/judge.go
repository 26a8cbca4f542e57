package cacheguard

import (
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
	// late: past every window above, but served while a reload of it runs
	// that is not the call's own (see lateFor).
	late
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
	// reloading: a reload of the value runs that the call did not start
	// (see lateFor).
	reloading bool
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
	case v.now < e.staleUntil && (c.policy != policyWait || v.now < e.freshUntil+c.grace(e.delta).Milliseconds()):
		return stale
	case v.reloading && !e.failSafe && v.now < c.lateUntil(e):
		return stale
	case v.now < e.staleUntil:
		return expired
	case !e.failSafe && c.failSafeAge > 0 && v.now < e.freshUntil+c.failSafeAge.Milliseconds():
		return expired // a fail-safe value keeps its first deadline, in stale-until
	case !e.failSafe && v.now < c.lateUntil(e):
		return late
	}
	return gone
}

// earlyRefreshCap is the share of the TTL, at its end, within which an
// early refresh may start, and past its end within which a value is served
// while its refresh runs at least (see grace).
const earlyRefreshCap = 4 // a quarter

// xfetch decides an early refresh of a fresh value at now (unix ms): once
// now + lead ≥ fresh-until (see lead).
func (c *config) xfetch(now int64, e *envelope) bool {
	if c.beta <= 0 || e.delta <= 0 || e.failSafe || e.negative {
		return false
	}
	return float64(now)+c.lead(e) >= float64(e.freshUntil)
}

// lead is how long before its fresh-until a value's early refresh starts
// (ms): Δ·β·(2 + 2u) — at least twice the value's last load, three times on
// average, so that the refresh ends before expiry even when the load is
// slower than the last — capped at a point between an eighth and a quarter
// of the TTL, (1 − v/2)·TTL/4. u and v are drawn once per value, from its
// fresh-until and last load, so that every hit in every process finds the
// same lead. XFetch draws a gap per hit instead, and a hot key's refresh
// then begins at the largest of many draws, the earlier the more the key is
// read, for loads the ideal does not need; and at the cap, one point, keys
// filled together whose loads are slow (a cold start against a busy
// database) would refresh together in every cycle after, each wave slowing
// the loads that keep it going.
func (c *config) lead(e *envelope) float64 {
	x := uint64(e.freshUntil)*0x9e3779b97f4a7c15 ^ uint64(e.delta)
	x ^= x >> 30 // splitmix64's finaliser
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	u := float64(x>>40) / (1 << 24)       // [0, 1), the high 24 bits
	v := float64(x&(1<<24-1)) / (1 << 24) // [0, 1), the low 24 bits
	gap := float64(e.delta.Microseconds()) / 1000 * c.beta * (2 + 2*u)
	return min(gap, float64(c.ttl.Milliseconds())/earlyRefreshCap*(1-v/2))
}

// grace is how long past fresh-until a value whose load took delta is
// served, marked Stale, while its refresh runs, whatever the policy (see
// EarlyRefresh): a hot key whose refresh is late does not make its readers
// wait. StaleGrace sets it; with early refresh on it is twice the value's
// own load, so that a refresh as slow as that load, begun as late as its lead
// allows, still ends within it — never less than a quarter of the TTL nor
// more than half.
func (c *config) grace(delta time.Duration) time.Duration {
	switch {
	case c.graceSet:
		return c.graceD
	case c.beta <= 0:
		return 0
	}
	return min(max(2*delta, c.ttl/earlyRefreshCap), c.ttl/2)
}

// lateFor is how long past fresh-until a value is served, marked Stale,
// to a call that finds a reload of it running that it did not start — in
// this process, or under another process's fill lease — instead of waiting
// for that reload: the TTL, with the default grace on; the grace when
// StaleGrace sets it (0 with it: ginmw.Cache). The grace decides who may
// start a reload without waiting; past it, a database slowed down (its
// reload slower than the grace, begun on time) does not make the key's
// readers wait, while the first call to find no reload running waits for
// its own, as on any miss.
func (c *config) lateFor(delta time.Duration) time.Duration {
	if c.graceSet {
		return c.graceD
	}
	if g := c.grace(delta); g > 0 {
		return max(g, c.ttl)
	}
	return 0
}

// lateUntil is when e's late window ends (unix ms): the call's lateFor past
// fresh-until, but never past the value's own retention (keep-until), which
// the call that stored it set from its TTL — a call with a longer TTL does
// not stretch a shorter-lived value's window.
func (c *config) lateUntil(e *envelope) int64 {
	return min(e.freshUntil+c.lateFor(e.delta).Milliseconds(), e.keepUntil)
}

// staleFor is the stale window stored with a value whose load took delta:
// ServeStale's window, or the refresh grace, whichever is longer.
func (c *config) staleFor(delta time.Duration) time.Duration {
	return max(c.staleWindow, c.grace(delta))
}

// keep is how long a value fresh for fresh, whose load took delta, is kept
// in Redis: its stale window, FailSafe's max age, or its late window
// (lateFor), past fresh-until.
func (c *config) keep(fresh, delta time.Duration) time.Duration {
	return fresh + max(c.staleFor(delta), c.failSafeAge, c.lateFor(delta))
}
