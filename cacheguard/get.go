package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"time"
)

// Get returns the value cached under key, loading it with load when it is
// absent or expired, so that each expiry costs one load across every process
// sharing the Redis:
//
//   - A hit costs one round trip (an HGET of the value).
//   - On a miss, the callers of one process share one flight per type and
//     generation (in-process coalescing); the flight runs one script that
//     returns the value or grants the fill lease, and waits for the holder's
//     push when another process fills. The lease holder loads under a
//     context detached from every caller (bounded by LoadTimeout), renewing
//     the lease while the loader runs, stores the value only if it still holds
//     the lease and the key was not invalidated meanwhile, and publishes it;
//     the waiters of every other process receive the value itself with the
//     wake-up. A holder that dies stops renewing; its lease expires and one
//     waiter takes over.
//   - The policy (Wait, ServeStale, FailFast) says what a call that finds no
//     fresh value does; none waits longer than its ctx and its wait budget,
//     even when Redis does not answer.
//   - A Get that begins after an Invalidate of key returned, in any process,
//     never returns a value loaded before it (see the package documentation,
//     Consistency).
//   - A loader returning (or wrapping) ErrNotFound is cached as absent for the
//     negative TTL; a panicking loader becomes a *PanicError for every caller
//     sharing the load.
//   - When Redis cannot be reached the call fails open by default: the loader
//     runs, coalesced in the process (a call shares only a load that began
//     after it), and nothing is cached (see FailClosed).
//
// Callers sharing a load share its value: when T holds pointers, maps or
// slices, treat the value as read-only. Bad input (nil guard, empty or
// oversize key, nil loader, invalid option) is an ErrInvalid before any Redis
// call.
func Get[T any](ctx context.Context, g *Guard, key string, load func(context.Context) (T, error), opts ...CallOption) (T, error) {
	if g != nil && g.near != nil && len(opts) == 0 && load != nil && validKey(key) == nil && !g.isClosed() {
		// The near cache's hit path, before the call's configuration is
		// copied: it allocates nothing.
		if v, ok := nearHit(ctx, g, &g.cfg, key, load); ok {
			return v, nil
		}
	}
	cfg, err := g.callConfig(key, load != nil, opts)
	if err != nil {
		var zero T
		return zero, err
	}
	if g.near != nil && len(opts) > 0 {
		if v, ok := nearHit(ctx, g, &cfg, key, load); ok {
			return v, nil
		}
	}
	c := call[T]{g: g, cfg: cfg, key: key, rep: representation(reflect.TypeFor[T](), cfg.variant), load: load} // on the stack
	v, res, err := c.get(ctx)
	if cfg.report != nil {
		*cfg.report = res
	}
	return v, err
}

// nearHit serves a call from the near cache when it can.
func nearHit[T any](ctx context.Context, g *Guard, cfg *config, key string, load func(context.Context) (T, error)) (T, bool) {
	now := time.Now()
	v, e, ok := nearGet[T](g.near, key, reflect.TypeFor[T](), cfg.variant, cfg.tags.list(), now)
	if !ok {
		return v, false
	}
	g.noteNearHit(ctx, key)
	if nearXFetch(now, e, cfg.beta, cfg.ttl) {
		c := call[T]{g: g, cfg: *cfg, key: key, rep: representation(reflect.TypeFor[T](), cfg.variant), load: load}
		c.detach().refresh(ctx, e.gen, false, fillEarly, e.freshUntil)
	}
	if cfg.report != nil {
		*cfg.report = Hit
	}
	return v, true
}

// call is one Get.
type call[T any] struct {
	g    *Guard
	cfg  config // by value: escape analysis would move a pointed-to config to the heap
	key  string
	rep  string // the representation: T's name and the Variant
	load func(context.Context) (T, error)
	near nearSnap // the near cache when the call's read began
	// fallback is an older value the call's read found, that may stand in
	// for a failed or slow load (FailSafe, SoftTimeout); nil if none.
	fallback *envelope
}

// detach returns a copy of c on the heap, for the goroutines of the miss path,
// so that the hit path keeps c and its configuration on the stack.
func (c *call[T]) detach() *call[T] {
	d := *c
	return &d
}

func (c *call[T]) get(ctx context.Context) (T, Result, error) {
	var zero T
	start := time.Now() // starts the wait budget, and judges freshness (one clock read on a hit)
	budget := getTimer(c.cfg.wait)
	defer putTimer(budget)
	g := c.g
	values, field, rep := g.readKeys(c.key, c.rep)
	if g.near != nil {
		c.near = g.near.snap(c.key, c.cfg.tags.list(), start)
	}
	if c.cfg.tags != nil {
		rep += "\x00" + c.cfg.tags.key // tagged reads fetch the tags' versions too
	}
	s, err := g.readStored(ctx, values, field, rep, c.cfg.tags.list(), start.Add(c.cfg.wait), budget.C)
	var force bool     // the stored value is unreadable: replace it even if its header says fresh
	var redisErr error // the cache is unreachable: fail open or closed
	switch {
	case errors.Is(err, errBudget):
		g.note(ctx, EventRedisError, c.key, 0, err)
		return c.detach().timedOut(ctx)
	case errors.Is(err, ErrClosed):
		return zero, Miss, err
	case err != nil:
		return zero, Miss, c.ctxErr(ctx)
	case s.err != nil:
		g.note(ctx, EventRedisError, c.key, 0, s.err)
		redisErr = s.err
	case s.b != nil:
		v, res, err, done := c.fromStored(ctx, s, start.UnixMilli())
		if done {
			return v, res, err
		}
		force = err != nil
	}
	if c.cfg.policy == policyFailFast && redisErr == nil {
		g.note(ctx, EventMiss, c.key, 0, nil)
		c.detach().refresh(ctx, s.gen, force, fillMiss, 0)
		return zero, Miss, fmt.Errorf("%w: %q", ErrMiss, c.key)
	}
	return c.detach().wait(ctx, start, budget, s, force, redisErr)
}

// fromStored serves a stored envelope when it is fresh at now (unix ms, read
// before the read was sent), or stale and the policy allows it. A value in
// Redis is always of the key's current generation: Invalidate deletes the
// values with the generation's move. done is false when the call must go on
// as a miss; err is then a decode error (or nil when the value is only too
// old).
func (c *call[T]) fromStored(ctx context.Context, s stored, now int64) (v T, res Result, err error, done bool) {
	g := c.g
	env, err := decodeEnvelope(s.b)
	if err != nil {
		g.note(ctx, EventDecodeError, c.key, 0, err)
		return v, 0, err, false
	}
	if !c.cfg.tags.fresh(&env, s.tagVers) {
		// Loaded before one of the call's tags was invalidated (or with other
		// tags): not servable, and to be replaced even if its header says
		// fresh.
		return v, 0, errStaleTags, false
	}
	switch {
	case now < env.freshUntil && env.failSafe && !env.negative:
		// An older value re-stored after a failed load: served, marked
		// stale, until its back-off ends.
		if v, err = decodeValue[T](c.cfg.codec, &env); err != nil {
			g.note(ctx, EventDecodeError, c.key, 0, err)
			return v, 0, err, false
		}
		g.note(ctx, EventFailSafe, c.key, 0, nil)
		return v, Stale, nil, true
	case now < env.freshUntil && env.negative:
		g.note(ctx, EventHit, c.key, 0, nil)
		g.note(ctx, EventNegativeHit, c.key, 0, nil)
		return v, Hit, c.notFound(), true
	case now < env.freshUntil:
		if v, err = decodeValue[T](c.cfg.codec, &env); err != nil {
			g.note(ctx, EventDecodeError, c.key, 0, err)
			return v, 0, err, false
		}
		if xfetch(now, &env, c.cfg.beta, c.cfg.ttl) {
			c.detach().refresh(ctx, env.gen, false, fillEarly, env.freshUntil)
		}
		if g.near != nil {
			g.near.put(c.near, c.key, reflect.TypeFor[T](), c.cfg.variant, c.cfg.tags.list(), v, &env)
		}
		g.note(ctx, EventHit, c.key, 0, nil)
		return v, Hit, nil, true
	case now < env.staleUntil && !env.negative && c.cfg.policy != policyWait:
		if v, err = decodeValue[T](c.cfg.codec, &env); err != nil {
			g.note(ctx, EventDecodeError, c.key, 0, err)
			return v, 0, err, false
		}
		g.note(ctx, EventStale, c.key, 0, nil)
		d := c.detach()
		d.fallback = &env
		d.refresh(ctx, env.gen, false, fillStale, 0)
		return v, Stale, nil, true
	}
	if c.canFallBack(&env, now) {
		c.fallback = &env
	}
	return v, 0, nil, false
}

// canFallBack reports whether a stored value may stand in for a failed or
// slow load at now: within its stale window, or FailSafe's max age past
// fresh-until (a fail-safe value keeps its first deadline, in stale-until).
func (c *call[T]) canFallBack(e *envelope, now int64) bool {
	switch {
	case e.negative:
		return false
	case now < e.staleUntil:
		return true
	case e.failSafe:
		return false
	}
	return c.cfg.failSafeAge > 0 && now < e.freshUntil+c.cfg.failSafeAge.Milliseconds()
}

// fallBack returns the call's fallback value, marked stale (EventFailSafe).
func (c *call[T]) fallBack(ctx context.Context) (T, Result, error, bool) {
	v, err := decodeValue[T](c.cfg.codec, c.fallback)
	if err != nil {
		return v, 0, err, false
	}
	c.g.note(ctx, EventFailSafe, c.key, 0, nil)
	return v, Stale, nil, true
}

// earlyRefreshShare is the share of the TTL, at its end, within which an
// early refresh may start (see EarlyRefresh).
const earlyRefreshShare = 20 // the last 1/20

// errStaleTags marks a stored value loaded under older versions of the
// call's tags.
var errStaleTags = errors.New("cacheguard: stored under older tag versions")

// xfetch decides a probabilistic early refresh: now − Δ·β·ln(rand) ≥
// fresh-until, the gap Δ·β·ln(rand) capped at ttl/earlyRefreshShare.
func xfetch(now int64, e *envelope, beta float64, ttl time.Duration) bool {
	if beta <= 0 || e.delta <= 0 {
		return false
	}
	gap := -float64(e.delta.Microseconds()) / 1000 * beta * math.Log(rand.Float64())
	gap = min(gap, float64(ttl.Milliseconds())/earlyRefreshShare)
	return float64(now)+gap >= float64(e.freshUntil)
}

// wait runs the miss path: join (or start) a flight of this process for the
// representation that what the call's read found (s) allows it to join (see
// flights.join), and wait for it within ctx and the wait budget. With Redis
// unreachable it shares a fail-open load instead.
func (c *call[T]) wait(ctx context.Context, start time.Time, budget *time.Timer, s stored, force bool, redisErr error) (T, Result, error) {
	g := c.g
	ks := g.keys(c.key, c.rep)
	id := g.callIDs.Add(1)
	deadline := start.Add(c.cfg.wait)
	k := flightKey{rep: ks.rep, typ: reflect.TypeFor[T]()}
	if c.cfg.tags != nil {
		k.tags = c.cfg.tags.key
	}
	missed := false
	var soft <-chan time.Time // SoftTimeout: then the fallback, while the load goes on
	if c.cfg.softTimeout > 0 && c.fallback != nil {
		t := time.NewTimer(time.Until(start.Add(c.cfg.softTimeout)))
		defer t.Stop()
		soft = t.C
	}
	for {
		var done <-chan struct{}
		var o func() *outcome
		var leave func()
		if redisErr != nil {
			w := g.unleased.join(k, func() *outcome { return c.failOpen(ctx, id, deadline, redisErr) })
			if w == nil {
				return c.zero(Miss, ErrClosed)
			}
			done, o, leave = w.done, func() *outcome { return w.r }, func() { g.unleased.leave(k, w) }
		} else {
			f, leader, pending := g.flights.join(k, s)
			if pending {
				// A flight that has not heard from Redis yet may turn out to be
				// one this call can join: see what its script answers.
				select {
				case <-f.asked:
					continue
				case <-ctx.Done():
					return c.zero(Miss, c.ctxErr(ctx))
				case <-budget.C:
					return c.timedOut(ctx)
				}
			}
			if leader {
				g.startFlight(ctx, k, f, func(fctx context.Context) *outcome {
					return c.flight(fctx, f, ks, id, deadline, force)
				})
			}
			done, o, leave = f.done, func() *outcome { return f.o }, func() {}
		}
		if !missed {
			// Counted once the call has joined a flight, so a miss in Stats
			// (or an observer's EventMiss) is a call already waiting for it.
			missed = true
			g.note(ctx, EventMiss, c.key, 0, nil)
		}
		select {
		case <-done:
			o := o()
			if errors.Is(o.err, errFlightExpired) {
				if ctx.Err() != nil {
					return c.zero(Miss, c.ctxErr(ctx))
				}
				if time.Now().Before(deadline) {
					// Another caller's shorter budget ended that flight; this
					// caller's budget goes on with a flight of its own.
					force = false
					continue
				}
				return c.timedOut(ctx)
			}
			if o.leader != id {
				g.note(ctx, EventCoalescedLocal, c.key, 0, nil)
			}
			if c.cfg.tags != nil && o.err == nil && o.stored != nil && !c.cfg.tags.atLeast(o.stored.tagVers, o.stored.tagHash, s.tagVers) {
				// Loaded before a tag invalidation that this call's read
				// saw: load again (replacing the stored value).
				force = true
				continue
			}
			v, res, err := c.deliver(o, id)
			if o.failSafe && err == nil {
				g.note(ctx, EventFailSafe, c.key, 0, nil)
				res = Stale
			}
			if err == nil && o.stored != nil && g.near != nil {
				g.near.put(c.near, c.key, reflect.TypeFor[T](), c.cfg.variant, c.cfg.tags.list(), v, o.stored)
			}
			return v, res, err
		case <-ctx.Done():
			leave()
			return c.zero(Miss, c.ctxErr(ctx))
		case <-budget.C:
			leave()
			return c.timedOut(ctx)
		case <-soft:
			if v, res, err, ok := c.fallBack(ctx); ok {
				leave()
				return v, res, err
			}
			soft = nil
		}
	}
}

func (c *call[T]) timedOut(ctx context.Context) (T, Result, error) {
	c.g.note(ctx, EventWaitTimeout, c.key, 0, nil)
	if c.cfg.onTimeout == TimeoutLoad {
		return c.loadWithoutLease(ctx)
	}
	return c.zero(Miss, fmt.Errorf("%w: %q after %v", ErrWaitTimeout, c.key, c.cfg.wait))
}

// loadWithoutLease runs the loader without the fill lease after the wait
// budget ended (TimeoutLoad), shared only with the callers of this process
// that arrived before it started (see queue). Nothing is stored.
func (c *call[T]) loadWithoutLease(ctx context.Context) (T, Result, error) {
	g := c.g
	id := g.callIDs.Add(1)
	k := flightKey{rep: g.keys(c.key, c.rep).rep, typ: reflect.TypeFor[T]()}
	w := g.unleased.join(k, func() *outcome {
		tctx, done, ok := g.track(context.WithoutCancel(ctx))
		if !ok {
			return &outcome{leader: id, err: ErrClosed}
		}
		defer done()
		v, err := c.runLoader(tctx)
		return &outcome{leader: id, loaded: true, val: v, err: err}
	})
	if w == nil {
		return c.zero(Miss, ErrClosed)
	}
	select {
	case <-w.done:
		o := w.r
		if o.leader != id {
			g.note(ctx, EventCoalescedLocal, c.key, 0, nil)
		}
		return c.deliver(o, id)
	case <-ctx.Done():
		g.unleased.leave(k, w)
		return c.zero(Miss, c.ctxErr(ctx))
	}
}

// deliver turns a flight's outcome into this caller's return values.
func (c *call[T]) deliver(o *outcome, id uint64) (T, Result, error) {
	res := Coalesced
	if o.leader == id && o.loaded {
		res = Miss
	}
	if o.err != nil {
		return c.zero(res, o.err)
	}
	if v, ok := o.val.(T); ok || o.val == nil {
		return v, res, nil
	}
	// Flights are kept apart by type: this cannot happen.
	return c.zero(res, fmt.Errorf("cacheguard: key %q was loaded as %T by a concurrent call, not as %T", c.key, o.val, *new(T)))
}

func (c *call[T]) zero(res Result, err error) (T, Result, error) {
	var zero T
	return zero, res, err
}

func (c *call[T]) ctxErr(ctx context.Context) error {
	return fmt.Errorf("cacheguard: get %q: %w", c.key, ctx.Err())
}

func (c *call[T]) notFound() error { return fmt.Errorf("%w: %q", ErrNotFound, c.key) }
