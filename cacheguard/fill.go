package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	leases "github.com/cacheguard/cacheguard/internal/lease"
	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// fillKind says why a flight runs (an early refresh is reported as one).
type fillKind uint8

const (
	fillMiss  fillKind = iota // nothing servable was cached
	fillStale                 // a stale value was served (ServeStale)
	fillEarly                 // an early refresh of a fresh value (see lead)
)

// fill loads the keys of fs, whose fill leases this call holds (granted to a
// request sent at sent), with one loader call; then, in one pipeline, stores each
// value (or the absence) under its lease's compare-and-set, waking the
// waiters, or releases the lease telling them why — with FailSafe, storing
// instead an older value judge lets stand in. A load that Close cancelled, or
// that declined (ErrClosed), is handed over ('h': a waiter elsewhere takes
// the fill over at once; callers here get ErrClosed). A flight whose lease
// turns out lost takes no new callers: what it loaded may be older than what
// another fill stored. The leases are renewed from the grant until that
// pipeline answered: encoding and sending a value count as the fill's work.
func (c *call[T]) fill(ctx context.Context, fs []*flight, tagVers []uint64, kind fillKind, sent time.Time) {
	g := c.g
	start := time.Now()
	// The leases are renewed until the load timeout at most (the hard
	// timeout): a loader that ignores its context then loses them within a
	// lease, so that another process can load.
	stop := g.renew(ctx, fs, c.cfg.lease, sent, start.Add(c.cfg.loadTimeout))
	defer stop() // also when a codec or an observer panics: Close would wait for the renewals
	names := keysOf(fs)
	if kind == fillMiss {
		for _, f := range fs {
			g.flights.setStore(f.t, storeOpen)
			defer g.flights.setStore(f.t, storeNone) // also when a codec or an observer panics
		}
	}
	if kind == fillEarly {
		g.note(ctx, EventEarlyRefresh, names[0], 0, nil)
	}
	var vals map[string]T
	free, waited, err := g.slot(ctx, kind != fillMiss, start.Add(c.cfg.loadTimeout), fs)
	if err == nil && waited && kind == fillMiss {
		g.confirm(ctx, fs, c.cfg.lease, start.Add(c.cfg.loadTimeout))
	}
	loaded := time.Now() // the load's own time (the grace, XFetch) leaves out a wait for a slot
	// A flight that turned unfit before its load began — while it waited
	// for a slot, typically, whose end confirms the leases — has no callers
	// left (see unfitLocked), and its store would fail: it loads nothing, and
	// another process's waiters take the fill over at once, as from a fill
	// handed over.
	abandoned := err == nil && kind == fillMiss && !slices.ContainsFunc(fs, func(f *flight) bool { return f.t.fill.Load() != storeStale })
	if err == nil {
		if !abandoned {
			vals, err = c.runLoader(ctx, names, start.Add(c.cfg.loadTimeout))
		}
		free()
	}
	// Closing ended the load (slot and runLoader say so: ErrClosed), or its
	// loader declined it with ErrClosed: the fill is handed over.
	handOver := declined(err)
	// Store or release even when Close cancelled the load: a lease left
	// behind would keep other processes waiting for its expiry.
	ctx = context.WithoutCancel(ctx)
	outs := make([]*outcome, len(fs))
	stores := make([]*redis.Cmd, len(fs))
	ends := make([]redis.Cmder, len(fs)) // each lease's store or release
	cmds := make([]redis.Cmder, 0, len(fs))
	for i, f := range fs {
		o := &outcome{leader: f.id, loaded: true}
		outs[i] = o
		took := time.Since(loaded)
		now := time.Now().UnixMilli()
		var env *envelope
		var ttl time.Duration
		var msg string // released with this message when nothing is stored
		v, found := vals[f.key]
		switch {
		case abandoned:
			o.err, msg = errFlightExpired, "h"
		case handOver:
			o.err, msg = errors.Join(ErrClosed, err), "h"
		case err == nil && found:
			payload, merr := encodeValue(c.cfg.codec, v)
			if merr != nil {
				o.err = fmt.Errorf("cacheguard: encode %q: %w", f.key, merr)
				msg = "e" + o.err.Error()
				break
			}
			// A TTL counts from the store, not the loader's end, and the
			// encoding is part of the load's time (XFetch's lead): a value
			// slower to encode than its TTL was stored already expired,
			// and its waiters elsewhere loaded it again.
			took, now = time.Since(loaded), time.Now().UnixMilli()
			fresh := c.cfg.ttl
			if kind != fillEarly {
				// An early refresh began within its value's own lead of
				// expiry, which differs from its neighbours' (see lead):
				// shortening its TTL too would spread nothing more and
				// cost a load in twenty (Jitter's default).
				fresh = jittered(fresh, c.cfg.jitter)
			}
			o.val, ttl = v, c.cfg.keep(fresh, took)
			env = &envelope{freshUntil: now + fresh.Milliseconds(), staleUntil: now + (fresh + c.cfg.staleFor(took)).Milliseconds(), delta: took, payload: payload}
		case err == nil || absent(err):
			if o.err = err; err == nil {
				o.err = notFound(f.key)
			}
			if msg = "n"; c.cfg.negTTL > 0 {
				ttl = jittered(c.cfg.negTTL, c.cfg.jitter)
				env = &envelope{freshUntil: now + ttl.Milliseconds(), staleUntil: now + ttl.Milliseconds(), delta: took, negative: true}
			}
		default:
			o.err, msg = err, failMessage(err)
			env, ttl = c.failSafe(o, f, tagVers, now)
		}
		if env == nil {
			ends[i] = g.release(ctx, f, msg)
			cmds = append(cmds, ends[i])
			continue
		}
		env.gen, env.keepUntil = f.lease.gen, now+ttl.Milliseconds() // kept as long as the hash's expiry says
		if env.tagVers == nil && tagVers != nil {
			env.tagHash, env.tagVers = c.cfg.tags.hash, tagVers
		}
		stores[i] = g.store(ctx, f, env.encode(), ttl)
		ends[i] = stores[i]
		cmds = append(cmds, stores[i])
		header := *env
		header.payload = nil
		o.env, o.stored = &header, !env.failSafe && !env.negative
	}
	for _, f := range fs {
		g.flights.setStore(f.t, storeNone) // the calls that arrive from now on read first
	}
	g.cmd.Exec(ctx, nil, cmds, 0, false)
	// Renewed until the store answered, not only while the loader ran: a
	// value slow to encode (tens of MB on a busy host) outlasted the rest of
	// the lease, and a waiter elsewhere took it over and loaded the key again
	// (TestLeaseKeptWhileEncoding).
	stop()
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			g.redisFailed(ctx, names[0], err) // ctx does not end: counted
			break
		}
	}
	// A store or release whose round trip broke may not have ended its
	// lease: it is given back, or the key's callers elsewhere would wait
	// for its expiry.
	var unended []*flight
	for i, f := range fs {
		if g.cmd.MayHaveRun(ends[i].Err()) {
			unended = append(unended, f)
		}
	}
	if len(unended) > 0 { // the leases of one round trip: one token (see fly)
		g.giveBack(ctx, unended, unended[0].lease.token, time.Now().Add(rcmd.CleanupHorizon))
	}
	for i, f := range fs {
		o := outs[i]
		if n, err := ends[i].(*redis.Cmd).Int64(); err == nil {
			o.current = stores[i] != nil && n == 1 || stores[i] == nil && n == 2
		}
		if stores[i] != nil {
			if n, err := stores[i].Int64(); err != nil || n != 1 {
				o.stored = false
				if err == nil {
					f.t.shut.Store(true) // the lease was lost
				}
			} else if g.near != nil && o.stored && o.err == nil {
				// Stored: the key's other representations are older now (the
				// other processes drop them on the store's message, which
				// this Guard ignores).
				g.near.put(f.near, f.key, c.nearID(), c.cfg.tags.list(), o.val, o.env, true)
			} else if g.near != nil {
				g.near.drop(f.key)
			}
		}
		g.flights.finish(f, o)
	}
}

// failSafe returns the envelope to store when f's load failed and an older
// value may stand in for it (FailSafe): the value f's starter found, judged
// under the lease's generation and the tags' versions read with it, stored
// again for the back-off (never past its first deadline), so that no process
// loads again before then. It sets o to that value, marked stale. It returns
// nil when there is none.
func (c *call[T]) failSafe(o *outcome, f *flight, tagVers []uint64, now int64) (*envelope, time.Duration) {
	fb := f.fallback
	if fb == nil || c.cfg.failSafeAge <= 0 || errors.Is(o.err, ErrUncached) ||
		c.cfg.judge(fb, &view{now: now, gen: f.lease.gen, tags: tagVers}) != expired {
		return nil, 0
	}
	v, err := decodeValue[T](c.cfg.codec, fb)
	if err != nil {
		return nil, 0
	}
	deadline := fb.staleUntil
	if !fb.failSafe {
		deadline = max(fb.staleUntil, fb.freshUntil+c.cfg.failSafeAge.Milliseconds())
	}
	o.val, o.err = v, nil
	env := *fb
	env.freshUntil, env.staleUntil, env.failSafe = min(now+c.cfg.failSafeOff.Milliseconds(), deadline), deadline, true
	return &env, time.Duration(deadline-now) * time.Millisecond
}

// runLoader runs the loader for keys under ctx until deadline (the load
// timeout's: a wait for a load slot counts against it), turning a panic into
// a *PanicError, and counts the load — unless the loader declined it (an
// error matching ErrClosed: its process is closing, or it was only waiting
// for another fill), which is no load. The loader's context marks it as a
// load of the Guard (see slot). A load the Guard's closing ended (ctx's
// cause) fails with ErrClosed joined to the loader's error, on every path
// (a fill, which then hands its lease over, or a load without the lease):
// its callers get ErrClosed, as Shutdown says, not the loader's
// context.Canceled.
func (c *call[T]) runLoader(ctx context.Context, keys []string, deadline time.Time) (vals map[string]T, err error) {
	start := time.Now()
	lctx, cancel := context.WithDeadline(context.WithValue(ctx, loadingKey{}, c.g), deadline)
	defer func() {
		cancel()
		if p := recover(); p != nil {
			err = newPanicError(p)
		}
		if declined(err) {
			return
		}
		c.g.note(ctx, EventLoad, strings.Join(keys, ","), time.Since(start), err)
		if err != nil && errors.Is(context.Cause(ctx), ErrClosed) {
			err = errors.Join(ErrClosed, err)
		}
	}()
	if c.one == nil {
		return c.load(lctx, keys)
	}
	v, err := c.one(lctx)
	if err != nil {
		return nil, err
	}
	return map[string]T{keys[0]: v}, nil
}

// loadUnleased runs the loader for keys without the fill lease — Redis cannot
// be reached (fail-open; cause is its error), or the calls' wait budget ended
// (TimeoutLoad; cause nil) — and caches nothing; with FailClosed a fail-open
// fails with ErrUnavailable instead. It waits for a slot of
// MaxConcurrentLoads (see slot): a fail-open load until deadline, one after
// the budget for the load timeout.
func (c *call[T]) loadUnleased(ctx context.Context, keys []string, id uint64, deadline time.Time, cause error) []*outcome {
	g := c.g
	outs := make([]*outcome, len(keys))
	fail := func(err error) []*outcome {
		for i, k := range keys {
			outs[i] = &outcome{leader: id, err: err}
			if err == ErrUnavailable {
				outs[i].err = errors.Join(fmt.Errorf("%w: %q", ErrUnavailable, k), cause)
			}
		}
		return outs
	}
	if cause != nil && c.cfg.failClosed {
		return fail(ErrUnavailable)
	}
	ctx, done, ok := g.track(context.WithoutCancel(ctx))
	if !ok {
		return fail(ErrClosed)
	}
	defer done()
	if cause == nil { // past the wait budget: a slot as a fill waits for one
		deadline = time.Now().Add(c.cfg.loadTimeout)
	}
	free, _, err := g.slot(ctx, false, deadline, nil)
	switch {
	case err != nil && ctx.Err() != nil:
		return fail(ErrClosed)
	case err != nil:
		return fail(errFlightExpired)
	}
	defer free()
	if cause != nil {
		g.note(ctx, EventFailOpen, keys[0], 0, cause)
	}
	vals, err := c.runLoader(ctx, keys, time.Now().Add(c.cfg.loadTimeout))
	for i, k := range keys {
		o := &outcome{leader: id, loaded: true, err: err}
		if v, found := vals[k]; err == nil && found {
			o.val = v
		} else if err == nil {
			o.err = notFound(k)
		}
		outs[i] = o
	}
	return outs
}

// failMessage is the release message of a load that failed with err, which
// tells the waiters in other processes its kind (see fromWake): 'p' and the
// panic's value for a panic, 'u' and the text for an answer not to be cached
// (ErrUncached), else 'e' and the text.
func failMessage(err error) string {
	var pe *PanicError
	switch {
	case errors.As(err, &pe):
		return "p" + fmt.Sprint(pe.Value)
	case errors.Is(err, ErrUncached):
		return "u" + err.Error()
	}
	return "e" + err.Error()
}

// absent reports whether err says the thing loaded does not exist: it wraps
// ErrNotFound, and is no panic (a PanicError whose value wraps it is a
// failure, never cached as an absence).
func absent(err error) bool {
	var pe *PanicError
	return errors.Is(err, ErrNotFound) && !errors.As(err, &pe)
}

// keysOf returns the keys of fs.
func keysOf(fs []*flight) []string {
	keys := make([]string, len(fs))
	for i, f := range fs {
		keys[i] = f.key
	}
	return keys
}

// renew renews the fill leases of fs, granted to a request sent at sent,
// every third of the lease from then, in one round trip (see every), until
// stop is called or the deadline passes — not when the Guard closes: Close
// and Shutdown wait for the fill, which stores what its loader returned
// before (a value still encoding, a loader that ignored its context) or
// hands its leases over, and a lease left to run out meanwhile let a waiter
// elsewhere take it over and load the key a second time for one expiry
// (TestLeaseKeptWhileEncodingPastClose). stop does not wait for a renewal on
// its way: the store's compare-and-set needs none, and on a starved host
// that wait cost every waiter in the fleet hundreds of ms. A lease found gone shuts its flight
// (it takes no new callers) and is renewed no more.
func (g *Guard) renew(ctx context.Context, fs []*flight, leaseFor time.Duration, sent, deadline time.Time) (stop func()) {
	cmd := func(ctx context.Context, f *flight) redis.Cmder { return renewal(ctx, f, leaseFor) }
	stop, ok := g.every(ctx, fs, leaseFor/3, time.Until(leases.Grant{Sent: sent, Lease: leaseFor}.RenewAt()), deadline, true, cmd, g.kept)
	if !ok {
		return func() {} // closing: the fill hands its leases over
	}
	return stop
}

// confirm renews the fill leases of fs once, now — a fill that waited for a
// load slot, before its loader runs: an Invalidate in another process may
// have voided a lease meanwhile, and the periodic renewal would find out
// only up to a third of the lease later, once a load had begun whose store
// must fail while the flight's callers load again. A flight whose lease is
// void turns unfit here as there (see kept).
func (g *Guard) confirm(ctx context.Context, fs []*flight, leaseFor time.Duration, deadline time.Time) {
	ctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	defer cancel()
	cmds := make([]redis.Cmder, len(fs))
	for i, f := range fs {
		cmds[i] = renewal(ctx, f, leaseFor)
	}
	g.cmd.Exec(ctx, nil, cmds, 0, false)
	for i, f := range fs {
		g.kept(f, cmds[i])
	}
}

// renewal is the command that renews f's fill lease for leaseFor.
func renewal(ctx context.Context, f *flight, leaseFor time.Duration) redis.Cmder {
	return renewScript.Cmd(ctx, keys(f.n.lease, f.n.gen), f.lease.String(), leaseFor.Milliseconds(), f.lease.genText())
}

// kept reports whether renewal c kept f's lease. A lease found void (taken
// over, expired, or its key invalidated since it was granted) shuts f's
// flight, which turns unfit (see flights.unfitLocked); one not renewed for
// an error is found out by the store.
func (g *Guard) kept(f *flight, c redis.Cmder) bool {
	if n, err := c.(*redis.Cmd).Int64(); err == nil && n == 0 {
		f.t.shut.Store(true)
		g.flights.unfit(f.t)
		return false
	}
	return true
}

// refresh fills key's entry in the background, under the fill lease — after
// a stale value was served (ServeStale), for an early refresh (see lead), or
// for a miss under FailFast — unless a flight of the entry runs in this
// process already, which will do. The lease is taken only when the stored
// value is not fresh until later than after (0: now), so a refresh that
// another process finished meanwhile is not repeated. gen is the generation
// the call's read found.
func (c *call[T]) refresh(ctx context.Context, key string, gen int64, force bool, kind fillKind, after int64, fallback *envelope) {
	g := c.g
	n := g.names(key, c.rep)
	t, leader, _ := g.flights.join(entry{n.values, n.field}, c.typ, gen, func(t *task[entry, *outcome]) admission {
		if t.typ == c.typ && !t.shut.Load() {
			return take
		}
		return skip
	})
	if !leader {
		return
	}
	f := &flight{t: t, key: key, n: n, id: g.callIDs.Add(1), force: force, after: after, fallback: fallback, near: g.near.ticket(key)}
	c.fly(ctx, []*flight{f}, time.Now().Add(c.cfg.wait), kind)
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
