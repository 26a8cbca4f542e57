package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strconv"
	"time"
)

// fillFor loads with the fill lease held and turns the result into the
// flight's outcome. A flight whose lease turns out lost takes no new callers:
// what it loads may be older than what another fill stored meanwhile.
func (c *call[T]) fillFor(ctx context.Context, f *flight, ks keySet, l lease, id uint64) *outcome {
	v, env, err := c.fill(ctx, ks, l, fillMiss, func() { f.closed.Store(true) })
	if env != nil && env.failSafe {
		return &outcome{leader: id, loaded: true, val: v, failSafe: true}
	}
	return &outcome{leader: id, loaded: true, val: v, err: err, stored: env}
}

// fillKind says why a fill runs: it decides whether the stored TTL is
// jittered (see Jitter).
type fillKind uint8

const (
	fillMiss  fillKind = iota // nothing servable was cached (a flight, or a miss under FailFast)
	fillStale                 // a stale value was served (ServeStale)
	fillEarly                 // an early refresh of a fresh value (XFetch)
)

// fill runs the loader while renewing the fill lease, then stores the value
// (or the absence) with the lease's compare-and-set and wakes the waiters, or,
// when the load failed, releases the lease and tells the waiters why. A load
// that Close (or Shutdown's deadline) cancelled, or whose loader returned an
// error matching ErrClosed, is handed over: the lease is released with a
// message that makes a waiter elsewhere take the fill over at once, and this
// process's callers get ErrClosed — never an error for others.
func (c *call[T]) fill(ctx context.Context, ks keySet, l lease, kind fillKind, lost func()) (T, *envelope, error) {
	g := c.g
	start := time.Now()
	// The lease is renewed until the load timeout at most (the hard timeout):
	// a loader that ignores its context then loses the lease within a lease,
	// so that another process can load.
	rctx, rcancel := context.WithDeadline(ctx, start.Add(c.cfg.loadTimeout))
	defer rcancel()
	stop := g.renewLease(rctx, ks, l, c.cfg.lease, lost)
	// A tagged value records its tags' versions as they are before it loads.
	var tagVers []uint64
	var tagErr error
	if tags := c.cfg.tags.list(); len(tags) > 0 {
		tagVers, tagErr = g.readTagVersions(ctx, tags, c.cfg.ttl+c.cfg.staleWindow)
		if tagErr != nil {
			g.note(ctx, EventRedisError, c.key, 0, tagErr)
		}
	}
	v, err := c.runLoader(ctx)
	stop()
	took := time.Since(start)
	now := time.Now().UnixMilli()
	// Handed over: Close (or Shutdown's deadline) cancelled the load, or the
	// loader itself reports that its process is closing (ErrClosed).
	closing := err != nil && (context.Cause(ctx) == ErrClosed || errors.Is(err, ErrClosed))
	// Store or release even when Close cancelled the load: a lease left behind
	// would keep other processes waiting for its expiry.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.lease)
	defer cancel()

	switch {
	case closing:
		c.releaseLease(ctx, ks, l, "h"+l.token+" ")
		var zero T
		return zero, nil, errors.Join(ErrClosed, err)
	case tagErr != nil:
		// Without the tags' versions the value cannot be stored: it is
		// returned uncached and the fill handed over.
		c.releaseLease(ctx, ks, l, "h"+l.token+" ")
		return v, nil, err
	case err == nil:
		payload, merr := encodeValue(c.cfg.codec, v)
		if merr != nil {
			err = fmt.Errorf("cacheguard: encode %q: %w", c.key, merr)
			c.releaseLease(ctx, ks, l, "e"+l.token+" "+err.Error())
			return v, nil, err
		}
		fresh := c.cfg.ttl
		if kind == fillMiss {
			fresh = jittered(fresh, c.cfg.jitter)
		}
		env := &envelope{
			freshUntil: now + fresh.Milliseconds(),
			staleUntil: now + (fresh + c.cfg.staleWindow).Milliseconds(),
			delta:      took,
			gen:        l.gen,
			payload:    payload,
		}
		if tagVers != nil {
			env.tagHash, env.tagVers = c.cfg.tags.hash, tagVers
		}
		if ok, err := g.store(ctx, c.key, ks, l, env.encode(), fresh+max(c.cfg.staleWindow, c.cfg.failSafeAge)); err != nil {
			g.note(ctx, EventRedisError, c.key, 0, err)
		} else if !ok {
			lost()
		} else if n := g.near; n != nil {
			// What this process near-cached of the key is older now: the
			// other processes drop it on the store's message (which this
			// Guard ignores), this one here — and keeps the new value.
			n.drop(c.key)
			n.put(n.snap(c.key, c.cfg.tags.list(), time.Now()), c.key, reflect.TypeFor[T](), c.cfg.variant, c.cfg.tags.list(), v, env)
		}
		stored := *env
		stored.payload = nil
		return v, &stored, nil
	case errors.Is(err, ErrNotFound) && c.cfg.negTTL > 0:
		ttl := c.cfg.negTTL
		if kind == fillMiss {
			ttl = jittered(ttl, c.cfg.jitter)
		}
		env := &envelope{freshUntil: now + ttl.Milliseconds(), staleUntil: now + ttl.Milliseconds(), delta: took, gen: l.gen, negative: true}
		if tagVers != nil {
			env.tagHash, env.tagVers = c.cfg.tags.hash, tagVers
		}
		if ok, serr := g.store(ctx, c.key, ks, l, env.encode(), ttl); serr != nil {
			g.note(ctx, EventRedisError, c.key, 0, serr)
		} else if !ok {
			lost()
		} else if g.near != nil {
			g.near.drop(c.key)
		}
		return v, nil, err
	case errors.Is(err, ErrNotFound):
		c.releaseLease(ctx, ks, l, "n"+l.token+" ")
		return v, nil, err
	case c.cfg.failSafeAge > 0 && c.fallback != nil && c.canFallBack(c.fallback, now) && !errors.Is(err, ErrUncached):
		// Fail-safe: the older value stands in, and is stored again for the
		// back-off (never past its first deadline), so that no process loads
		// again before then.
		fb := *c.fallback
		deadline := fb.staleUntil
		if !fb.failSafe {
			deadline = max(fb.staleUntil, fb.freshUntil+c.cfg.failSafeAge.Milliseconds())
		}
		fv, derr := decodeValue[T](c.cfg.codec, &fb)
		if derr != nil {
			c.releaseLease(ctx, ks, l, "e"+l.token+" "+err.Error())
			return v, nil, err
		}
		env := &envelope{freshUntil: min(now+c.cfg.failSafeOff.Milliseconds(), deadline), staleUntil: deadline,
			delta: fb.delta, gen: l.gen, failSafe: true, tagHash: fb.tagHash, tagVers: fb.tagVers, payload: fb.payload}
		if ok, serr := g.store(ctx, c.key, ks, l, env.encode(), time.Duration(deadline-now)*time.Millisecond); serr != nil {
			g.note(ctx, EventRedisError, c.key, 0, serr)
		} else if !ok {
			lost()
		}
		return fv, &envelope{failSafe: true}, nil
	default:
		c.releaseLease(ctx, ks, l, "e"+l.token+" "+err.Error())
		return v, nil, err
	}
}

func (c *call[T]) releaseLease(ctx context.Context, ks keySet, l lease, msg string) {
	if err := c.g.release(ctx, ks, l, msg); err != nil {
		c.g.note(ctx, EventRedisError, c.key, 0, err)
	}
}

// runLoader runs the loader under ctx bounded by the load timeout, turning a
// panic into a *PanicError, and counts the load.
func (c *call[T]) runLoader(ctx context.Context) (v T, err error) {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, c.cfg.loadTimeout)
	defer func() {
		cancel()
		if p := recover(); p != nil {
			err = newPanicError(p)
		}
		c.g.note(ctx, EventLoad, c.key, time.Since(start), err)
	}()
	return c.load(lctx)
}

// failOpen serves callers while Redis cannot be reached: the loader runs
// (bounded by MaxConcurrentLoads) and nothing is cached; or, with FailClosed,
// it fails with ErrUnavailable. It runs inside a flight (whose getLease
// failed) or as the work of g.unleased (the call's own read failed).
func (c *call[T]) failOpen(ctx context.Context, id uint64, deadline time.Time, cause error) *outcome {
	g := c.g
	if c.cfg.failClosed {
		return &outcome{leader: id, err: errors.Join(fmt.Errorf("%w: %q", ErrUnavailable, c.key), cause)}
	}
	ctx, done, ok := g.track(context.WithoutCancel(ctx))
	if !ok {
		return &outcome{leader: id, err: ErrClosed}
	}
	defer done()
	if g.sem != nil {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		select {
		case g.sem <- struct{}{}:
			defer func() { <-g.sem }()
		case <-wctx.Done():
			if ctx.Err() != nil {
				return &outcome{leader: id, err: ErrClosed}
			}
			return &outcome{leader: id, err: errFlightExpired}
		}
	}
	g.note(ctx, EventFailOpen, c.key, 0, cause)
	v, err := c.runLoader(ctx)
	return &outcome{leader: id, loaded: true, val: v, err: err}
}

// refresh fills the representation in the background under the fill lease,
// at most one refresh per representation, generation and process at a time:
// for a stale value (ServeStale), an early refresh (XFetch: only while the
// value is still the one fresh until after), or a miss under FailFast. The
// lease is taken only when the value is not fresh until later than after (0:
// now), so a refresh that another process finished meanwhile is not repeated.
func (c *call[T]) refresh(ctx context.Context, gen int64, force bool, kind fillKind, after int64) {
	g := c.g
	ks := g.keys(c.key, c.rep)
	mark := ks.rep + " " + strconv.FormatInt(gen, 10)
	if !g.startRefresh(mark) {
		return
	}
	var holdUntil time.Time // set when another process's fill holds the lease
	unmark := func() { g.endRefresh(mark, holdUntil) }
	tctx, done, ok := g.track(context.WithoutCancel(ctx))
	if !ok {
		unmark()
		return
	}
	go func() {
		defer done()
		defer unmark()
		defer func() { _ = recover() }() // a codec or an observer panicked: the refresh is dropped
		if after == 0 {
			after = time.Now().UnixMilli()
		}
		tok := token()
		r, err := g.getLease(tctx, ks, tok, c.cfg.lease, after, force)
		if err != nil {
			if tctx.Err() == nil {
				g.note(ctx, EventRedisError, c.key, 0, err)
			}
			return
		}
		if !r.granted {
			if r.pttl > 0 { // another fill runs: do not ask again before its lease ends
				holdUntil = time.Now().Add(r.pttl)
			}
			return
		}
		if kind == fillEarly {
			g.note(ctx, EventEarlyRefresh, c.key, 0, nil)
		}
		_, _, _ = c.fill(tctx, ks, lease{gen: r.gen, token: tok}, kind, func() {}) // a background refresh: the next read sees what it stored
	}()
}

// startRefresh marks key as being refreshed by this process; false when a
// refresh runs already, or another process's fill was seen holding the lease
// and its lease has not ended yet (so stale hits do not each send a script).
func (g *Guard) startRefresh(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	now := time.Now()
	if until, ok := g.refreshing[key]; ok && (until.IsZero() || now.Before(until)) {
		return false
	}
	if len(g.refreshing) >= 1024 { // forget expired holds now and then
		for k, until := range g.refreshing {
			if !until.IsZero() && now.After(until) {
				delete(g.refreshing, k)
			}
		}
	}
	g.refreshing[key] = time.Time{}
	return true
}

// endRefresh ends a refresh of key; with a non-zero holdUntil no new refresh
// of key starts before then.
func (g *Guard) endRefresh(key string, holdUntil time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if holdUntil.IsZero() {
		delete(g.refreshing, key)
	} else {
		g.refreshing[key] = holdUntil
	}
}

// jittered shortens d by a random fraction in [0, frac).
func jittered(d time.Duration, frac float64) time.Duration {
	if frac <= 0 {
		return d
	}
	return max(d-time.Duration(rand.Float64()*frac*float64(d)), time.Millisecond)
}

// encodeValue encodes v with cd, recovering a panicking codec.
func encodeValue(cd Codec, v any) (b []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("codec panicked: %v", p)
		}
	}()
	return cd.Marshal(v)
}
