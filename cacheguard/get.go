package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/internal/counter"
	"github.com/cacheguard/cacheguard/internal/rcmd"
)

// Get returns the value cached under key, loading it with load when it is
// absent or expired, so that each expiry costs one load across every process
// sharing the Redis:
//
//   - A hit costs one round trip (an HGET of the value).
//   - On a miss, the callers of one process share one flight per entry
//     (in-process coalescing); the flight runs one script that returns the
//     value or grants the fill lease, and waits for the holder's push when
//     another process fills. The lease holder loads under a context detached
//     from every caller (bounded by LoadTimeout), renewing the lease while
//     the loader runs, stores the value only if it still holds the lease and
//     the key was not invalidated meanwhile, and publishes it; the waiters of
//     every other process receive the value itself with the wake-up. A holder
//     that dies stops renewing; its lease expires and one waiter takes over.
//   - The policy (Wait, ServeStale, FailFast) says what a call that finds no
//     fresh value does; none waits longer than its ctx and its wait budget,
//     even when Redis does not answer.
//   - A Get that begins after an Invalidate of key (or an InvalidateTags of
//     one of its Tags) returned, in any process, never returns a value loaded
//     before it (see the package documentation, Consistency).
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
	cfg, err := g.callConfig(opts, load != nil)
	if err == nil {
		err = validKey(key)
	}
	if err != nil {
		var zero T
		return zero, err
	}
	var v T
	var res Result
	if g.near != nil {
		v, res, _ = nearHit(ctx, g, cfg, key, load, nil, time.Now()) // allocates nothing
	}
	if res == 0 {
		c := call[T]{g: g, cfg: *cfg, typ: reflect.TypeFor[T](), one: load} // on the stack
		c.rep = g.representation(c.typ, cfg.variant, cfg.tags)
		v, res, err = c.get(ctx, key)
	}
	if cfg.report != nil {
		*cfg.report = res
	}
	return v, err
}

// GetMany is Get for several keys at once, with one loader for the missing
// ones, so that each expiry still costs one load across every process. It
// takes the options Get takes, and runs the same engine:
//
//   - Near-cached keys cost nothing; the others are read in one round trip
//     (a pipeline; on a cluster one per node, in parallel).
//   - The misses join the flights of their entries running in this process,
//     and the others start one flight run for them all: their fill leases in
//     one round trip (one script call per hash slot), which returns a value
//     stored meanwhile instead of a lease; load runs once, with exactly the
//     keys whose leases the run got, under a context detached from the caller
//     (bounded by LoadTimeout), the leases renewed until the values are
//     stored, in one pipeline, and pushed to the waiters of every process.
//     A cold batch therefore costs three round trips and one loader call.
//   - Keys whose lease another caller holds (here or in another process) are
//     waited for as Get waits: pushed values, one load per key across the
//     fleet; if that holder dies, the key is taken over with a load of that
//     key alone.
//   - load returns the values it found; a key it leaves out does not exist:
//     it is cached as absent for the negative TTL and left out of GetMany's
//     result, with no error. A load that fails fails its keys.
//
// The result holds every key that has a value. When some keys failed (their
// load, Redis under FailClosed, the wait budget, ErrMiss under FailFast), the
// error is a KeyErrors with each key's error, next to the values of the
// others. ReportTo reports the least favourable way a key was served (Miss,
// then Coalesced, then Stale, then Hit). Values are shared: treat them as
// read-only. Bad input is an ErrInvalid before any Redis call.
func GetMany[T any](ctx context.Context, g *Guard, keys []string, load func(ctx context.Context, keys []string) (map[string]T, error), opts ...CallOption) (map[string]T, error) {
	for _, k := range keys {
		if err := validKey(k); err != nil {
			return nil, err
		}
	}
	cfg, err := g.callConfig(opts, load != nil)
	if err != nil {
		return nil, err
	}
	c := &call[T]{g: g, cfg: *cfg, typ: reflect.TypeFor[T](), load: load}
	c.rep = g.representation(c.typ, cfg.variant, cfg.tags)
	keys = slices.Clone(keys)
	slices.Sort(keys)
	out, res, err := c.many(ctx, slices.Compact(keys))
	if cfg.report != nil && res != 0 {
		*cfg.report = res
	}
	return out, err
}

// KeyErrors is the error GetMany returns when some keys failed: the error of
// each. It matches (errors.Is, errors.As) every one of them.
type KeyErrors map[string]error

func (e KeyErrors) Error() string {
	parts := make([]string, 0, len(e))
	for _, k := range slices.Sorted(maps.Keys(e)) {
		parts = append(parts, fmt.Sprintf("%q: %v", k, e[k]))
	}
	return "cacheguard: " + strings.Join(parts, "; ")
}

// Unwrap returns the keys' errors.
func (e KeyErrors) Unwrap() []error {
	errs := make([]error, 0, len(e))
	for _, k := range slices.Sorted(maps.Keys(e)) {
		errs = append(errs, e[k])
	}
	return errs
}

// call is one Get or GetMany.
type call[T any] struct {
	g    *Guard
	cfg  config // by value: escape analysis would move a pointed-to config to the heap
	typ  reflect.Type
	rep  string                                                         // the representation (see representation)
	one  func(context.Context) (T, error)                               // Get's loader
	load func(ctx context.Context, keys []string) (map[string]T, error) // GetMany's
}

// part is one key of a call: what its read found, and how it is served.
type part[T any] struct {
	key      string
	values   string     // the name of its values hash (see Guard.name); "" until join needs it
	id       uint64     // the call's part in the flights it joins
	near     nearTicket // taken before the read was sent
	s        stored
	force    bool      // the stored value must be replaced even if its header says fresh
	fallback *envelope // an older value that may stand in for a failed or slow load, or a reload not its own
	own      bool      // it started its flight
	missed   bool      // counted as a miss

	t       *task[entry, *outcome] // the flight it waits for, or
	u       *task[entry, *outcome] // the load without the lease it waits for
	pending bool                   // t is held (see admit)
	chain   *task[entry, stored]   // the callers of its read, for the flight it joins (see Guard.readOne)

	v   T
	res Result
	err error
}

// awaitFill serves sl, a call that arrived while flight t of its entry held
// the fill lease for a miss and had not sent its store, with the flight's
// outcome, without a read of its own — when the flight's store (a
// compare-and-set) or release found the generation the lease was granted
// under (outcome.current). That ran after the call arrived, so no
// invalidation came between the lease's grant, before the load began, and
// the call's arrival (generations only grow): a value, an absence or an
// error the flight's callers share is what a call that read after it
// arrived could have been given (read-your-writes after Invalidate rests on
// this). The call's tags, were it to have any, are not checked by the store:
// such a call reads. Otherwise (an invalidation or a lost lease came
// between) it reports false: the call then reads, counted as a miss already
// (its read neither counts it again nor as a hit: see readOne, hit) — at
// once when the flight turns unfit (unfit closes: an Invalidate in this
// process, or a renewal, a third of the lease after an invalidation
// elsewhere at most, found its lease void), not when its load ends. A call
// whose ctx or wait budget ends first ends as any waiting call does.
func (c *call[T]) awaitFill(ctx context.Context, sl *part[T], t *task[entry, *outcome], deadline time.Time) bool {
	// Counted as it waits, as a call that joins a flight after a read is
	// (see wait): a miss in Stats is a call already waiting.
	sl.missed = true
	c.g.note(ctx, EventMiss, sl.key, 0, nil)
	timer := getTimer(time.Until(deadline))
	defer putTimer(timer)
	select {
	case <-t.done:
	case <-t.unfit:
		return false
	case <-ctx.Done():
		sl.res, sl.err = Miss, ctxErr(sl.key, ctx)
		return true
	case <-timer.C:
		// On the heap, as on the miss path (see detach): sl and c stay on
		// their caller's stack.
		p := *sl
		c.detach().timedOut(ctx, &p, deadline)
		*sl = p
		return true
	}
	if o := t.res; o.current {
		c.g.note(ctx, EventCoalescedLocal, sl.key, 0, nil)
		c.deliver(ctx, sl, o)
		return true
	}
	return false
}

// detach returns a copy of c on the heap, for the miss path, so that the hit
// path keeps c and its configuration on the stack. Any path that may hand c
// or a part to a flight or a wait takes such copies: one that takes their
// address moves them to the heap for every Get, hits included
// (TestWarmHitAllocatesNoMoreThanPlainGet).
func (c *call[T]) detach() *call[T] {
	d := *c
	return &d
}

// get is a Get's call.
func (c *call[T]) get(ctx context.Context, key string) (T, Result, error) {
	g := c.g
	start := time.Now() // starts the wait budget, and judges freshness (one clock read on a hit)
	line := g.readLine(key, c.rep)
	sl := part[T]{key: key, values: line.name, near: g.near.ticket(key)}
	if g.flights.open.Load() != 0 && c.cfg.policy != policyFailFast && c.cfg.wait > 0 && c.cfg.tags.list() == nil && !g.nested(ctx) {
		if t := g.flights.filling(entry{sl.values, c.rep}, c.typ); t != nil && c.awaitFill(ctx, &sl, t, start.Add(c.cfg.wait)) {
			return sl.v, sl.res, sl.err
		}
	}
	var err error
	sl.s, sl.chain, err = g.readOne(ctx, entry{sl.values, c.rep}, c.cfg.tags.list(), c.cfg.readBound(start), line, c.typ, c.cfg.policy == policyFailFast, sl.missed)
	if sl.s.counted && !sl.missed {
		g.observe(ctx, EventMiss, key)
		sl.missed = true
	}
	if err != nil {
		s := &part[T]{key: key}
		c.detach().readFailed(ctx, s, err, start.Add(c.cfg.wait))
		return s.v, s.res, s.err
	}
	if f := sl.s.flight; f != nil && f.typ == c.typ && serves(&sl.s, f) && !errors.Is(f.res.err, errFlightExpired) {
		// The read this call shared found the entry absent, and the
		// flight it was handed to has ended: the call shares what it
		// returns, unless that was loaded under older counters.
		if c.servedBy(&sl, f) {
			g.note(ctx, EventCoalescedLocal, key, 0, nil)
			c.deliver(ctx, &sl, f.res)
			return sl.v, sl.res, sl.err
		}
		sl.s = unknown(g)
	}
	if c.serve(ctx, &sl, start.UnixMilli()) {
		return sl.v, sl.res, sl.err
	}
	return c.missOne(ctx, start, sl)
}

// missOne is a Get's miss path: the call and the part on the heap, in one
// allocation.
func (c *call[T]) missOne(ctx context.Context, start time.Time, sl part[T]) (T, Result, error) {
	m := &missCall[T]{c: *c, sl: sl}
	m.slots[0] = &m.sl
	// However the call ends, the callers of its read are not left waiting:
	// not handed to a flight (see join), they join one themselves.
	defer m.sl.chain.settle(nil)
	m.c.miss(ctx, start, m.slots[:])
	return m.sl.v, m.sl.res, m.sl.err
}

// missCall is a Get's call on its miss path (see get).
type missCall[T any] struct {
	c     call[T]
	sl    part[T]
	slots [1]*part[T]
}

// many is a GetMany's call.
func (c *call[T]) many(ctx context.Context, keys []string) (map[string]T, Result, error) {
	g := c.g
	start := time.Now()
	deadline := start.Add(c.cfg.wait)
	out := make(map[string]T, len(keys))
	var worst Result
	var errs KeyErrors
	done := func(sl *part[T]) {
		worst = worse(worst, sl.res)
		switch {
		case sl.err == nil:
			out[sl.key] = sl.v
		case !absent(sl.err):
			if errs == nil {
				errs = KeyErrors{}
			}
			errs[sl.key] = sl.err
		}
	}
	ks, tickets := keys, []nearTicket(nil)
	if g.near != nil {
		ks = make([]string, 0, len(keys))
		for _, k := range keys {
			if v, res, ok := nearHit(ctx, g, &c.cfg, k, nil, c.load, start); ok {
				out[k], worst = v, worse(worst, res)
				continue
			}
			ks, tickets = append(ks, k), append(tickets, g.near.ticket(k))
		}
	}
	// A key is a part on the stack while it is served, on the heap only when
	// it misses: a warm batch allocates no part.
	var missed []*part[T]
	if len(ks) > 0 {
		found := make([]stored, len(ks))
		values := g.valuesKeys(ks)
		err := g.fetch(ctx, values, c.rep, c.cfg.tags.list(), c.cfg.readBound(start), found, nil)
		for i, k := range ks {
			sl := part[T]{key: k, values: values[i], s: found[i]}
			if tickets != nil {
				sl.near = tickets[i]
			}
			switch {
			case err != nil:
				p := sl
				c.readFailed(ctx, &p, err, deadline)
				sl = p
			case !c.serve(ctx, &sl, start.UnixMilli()):
				p := sl
				missed = append(missed, &p)
				continue
			}
			done(&sl)
		}
	}
	if len(missed) > 0 {
		c.miss(ctx, start, missed)
		for _, sl := range missed {
			done(sl)
		}
	}
	if len(errs) > 0 {
		return out, worst, errs
	}
	return out, worst, nil
}

// worse returns the less favourable of two results (see GetMany).
func worse(a, b Result) Result {
	rank := [...]int{0, 2, 5, 3, 4, 1} // none, Hit, Miss, Stale, Coalesced, NearHit
	if a == 0 || b != 0 && rank[b] > rank[a] {
		return b
	}
	return a
}

// nearHit serves a key from the near cache when judge lets it (it allocates
// nothing), starting an early refresh within the value's lead (see lead).
func nearHit[T any](ctx context.Context, g *Guard, cfg *config, key string, one func(context.Context) (T, error),
	load func(context.Context, []string) (map[string]T, error), now time.Time) (v T, res Result, ok bool) {
	typ, ms := reflect.TypeFor[T](), now.UnixMilli()
	e, epoch := g.near.get(key, nearIDOf(typ, cfg), now)
	if e == nil || cfg.judge(&e.env, &view{now: ms, epoch: epoch}) != fresh {
		return v, 0, false
	}
	if v, ok = e.val.(T); !ok {
		return v, 0, false
	}
	g.note(ctx, EventNearHit, key, 0, nil)
	if cfg.xfetch(ms, &e.env) {
		c := &call[T]{g: g, cfg: *cfg, typ: typ, one: one, load: load}
		c.rep = g.representation(typ, cfg.variant, cfg.tags)
		c.refresh(ctx, key, e.env.gen, false, fillEarly, e.env.freshUntil, nil)
	}
	return v, NearHit, true
}

// readFailed serves sl when its read did not answer: its wait budget ended
// (see timedOut), the Guard closed, or ctx ended.
func (c *call[T]) readFailed(ctx context.Context, sl *part[T], err error, deadline time.Time) {
	switch {
	case errors.Is(err, errBudget): // a wait timeout, not a Redis failure
		c.timedOut(ctx, sl, deadline)
	case errors.Is(err, ErrClosed):
		sl.res, sl.err = Miss, ErrClosed
	default:
		sl.res, sl.err = Miss, ctxErr(sl.key, ctx)
	}
}

// serve judges what sl's read found (at now, unix ms read before the read
// was sent) and serves it when judge lets it: a fresh value (Hit), a stale
// one under ServeStale or FailFast (Stale, with a refresh in the
// background), a fail-safe one in its back-off (Stale). It reports whether
// sl is served; if not, sl says why (Redis failed, the value must be
// replaced, or an older value may stand in for the load).
func (c *call[T]) serve(ctx context.Context, sl *part[T], now int64) bool {
	g := c.g
	s := &sl.s
	if s.err != nil {
		g.redisFailed(ctx, sl.key, s.err)
		return false
	}
	if s.b == nil {
		return false
	}
	env, v, verdict := c.decode(ctx, sl.key, s.b, &view{now: now, gen: s.gen, tags: s.tagVers})
	if verdict != fresh || env.negative {
		g.near.seen(sl.key, env.gen) // a fresh value tells it put
	}
	switch verdict {
	case refused:
		sl.force = true
		return false
	case expired, late:
		fb := env
		sl.fallback = &fb
		return false
	case gone:
		return false
	}
	if env.negative {
		c.hit(ctx, sl)
		g.note(ctx, EventNegativeHit, sl.key, 0, nil)
		sl.res, sl.err = Hit, notFound(sl.key)
		return true
	}
	sl.v = v
	switch verdict {
	case failSafe:
		g.note(ctx, EventFailSafe, sl.key, 0, nil)
		sl.res = Stale
	case stale:
		g.note(ctx, EventStale, sl.key, 0, nil)
		fb := env
		c.detach().refresh(ctx, sl.key, s.gen, false, fillStale, 0, &fb)
		sl.res = Stale
	default:
		if c.cfg.xfetch(now, &env) {
			c.detach().refresh(ctx, sl.key, s.gen, false, fillEarly, env.freshUntil, nil)
		}
		if g.near != nil {
			g.near.put(sl.near, sl.key, c.nearID(), c.cfg.tags.list(), sl.v, &env, false)
		}
		c.hit(ctx, sl)
		sl.res = Hit
	}
	return true
}

// hit counts sl as a hit, unless it was counted as a miss when it began
// waiting for a fill that then could not serve it (see awaitFill): each key
// of a call is counted once in Stats (and told to the observer once), a hit
// or a miss, when it first finds which.
func (c *call[T]) hit(ctx context.Context, sl *part[T]) {
	if !sl.missed {
		c.g.note(ctx, EventHit, sl.key, 0, nil)
	}
}

// decode reads b, an envelope stored for key, judges it under v, and decodes
// its value when the verdict serves it (a cached absence has none). Bytes it
// cannot read are refused, as a decode error.
func (c *call[T]) decode(ctx context.Context, key string, b []byte, v *view) (env envelope, val T, verdict verdict) {
	env, err := decodeEnvelope(b)
	if err == nil {
		if verdict = c.cfg.judge(&env, v); verdict < fresh || env.negative {
			return env, val, verdict
		}
		if val, err = decodeValue[T](c.cfg.codec, &env); err == nil {
			return env, val, verdict
		}
	}
	c.g.note(ctx, EventDecodeError, key, 0, err)
	return env, val, refused
}

// miss runs the miss path of slots: each joins (or starts) a flight of its
// entry in this process that it may take the value of (see admit), the new
// ones run together, and each waits for its flight within ctx and the wait
// budget. With Redis unreachable the slots share loads run without the lease
// instead; under FailFast they fail with ErrMiss at once, a fill started in
// the background.
func (c *call[T]) miss(ctx context.Context, start time.Time, slots []*part[T]) {
	g := c.g
	if c.cfg.policy == policyFailFast {
		var rest []*part[T]
		for _, sl := range slots {
			if sl.s.err != nil {
				rest = append(rest, sl)
				continue
			}
			if !sl.missed {
				g.note(ctx, EventMiss, sl.key, 0, nil)
			}
			c.refresh(ctx, sl.key, sl.s.gen, sl.force, fillMiss, 0, sl.fallback)
			sl.res, sl.err = Miss, fmt.Errorf("%w: %q", ErrMiss, sl.key)
		}
		if slots = rest; len(slots) == 0 {
			return
		}
	}
	deadline := start.Add(c.cfg.wait)
	budget := getTimer(time.Until(deadline))
	defer putTimer(budget)
	var soft <-chan time.Time // SoftTimeout: then the fallback, while the load goes on
	softAt := start.Add(c.cfg.softTimeout)
	if c.cfg.softTimeout > 0 && slices.ContainsFunc(slots, func(sl *part[T]) bool { return sl.fallback != nil }) {
		t := time.NewTimer(time.Until(softAt))
		defer t.Stop()
		soft = t.C
	}
	c.join(ctx, slots, deadline)
	for _, sl := range slots {
		c.wait(ctx, sl, deadline, softAt, budget.C, soft)
	}
}

// fired is always ready: a timer that fired while another slot waited.
var fired = func() chan time.Time { c := make(chan time.Time); close(c); return c }()

// join makes each of slots join a flight (or, with Redis unreachable, a load
// without the lease), and starts the new ones together.
func (c *call[T]) join(ctx context.Context, slots []*part[T], deadline time.Time) {
	g := c.g
	var fs []*flight
	var open []*part[T]
	for _, sl := range slots {
		if sl.id == 0 {
			sl.id = g.callIDs.Add(1)
		}
		if errors.Is(sl.s.err, rcmd.ErrTimeout) && c.cfg.policy != policyFailFast {
			// Redis did not answer the read in time: slow, stalled, or this
			// process too busy to read the answer. That is no proof that
			// Redis is away, and failing open costs a load: the flight's
			// get-or-lease script, which returns the value when there is one,
			// asks again, and only when it fails too does the call fail open.
			// Nothing is known of the generation: a flight created from now
			// on sends its scripts after this call began, and is joined.
			sl.s = unknown(g)
		}
		if sl.s.err != nil {
			open = append(open, sl)
			continue
		}
		if sl.values == "" {
			sl.values = g.name("v:", sl.key)
		}
		t, leader, pending := g.flights.join(entry{sl.values, c.rep}, c.typ, sl.s.gen, admit(&sl.s, c.typ))
		sl.t, sl.pending, sl.own = t, pending, leader
		if t != nil && !leader && !pending && g.slots != nil && g.nested(ctx) {
			g.slots.promote(t) // it may wait for the slot this Get's caller holds
		}
		if sl.chain != nil && !pending {
			g.flights.chain(t, sl.chain)
		}
		if leader { // only a flight needs the key's other names
			fs = append(fs, &flight{t: t, key: sl.key, n: g.names(sl.key, c.rep), id: sl.id, force: sl.force, fallback: sl.fallback, near: g.near.ticket(sl.key)})
		}
	}
	if len(fs) > 0 {
		c.fly(ctx, fs, deadline, fillMiss)
	}
	if len(open) > 0 {
		c.joinUnleased(ctx, open, deadline, open[0].s.err)
	}
}

// joinUnleased makes each of sls share a load without the lease begun after
// it arrived (see loadUnleased; cause is Redis's error, or nil after the
// wait budget), and runs the new ones as one load, on a goroutine of their
// own detached from the callers, then the loads queued behind them.
func (c *call[T]) joinUnleased(ctx context.Context, sls []*part[T], deadline time.Time, cause error) {
	g := c.g
	var lead []*part[T]
	var keys []string
	for _, sl := range sls {
		if sl.id == 0 {
			sl.id = g.callIDs.Add(1)
		}
		// Its own choice, never a shared load's; and a loader's Get shares
		// no load without the lease: the one running may wait for the slot
		// its caller holds (see Guard.slot), and its own takes none.
		if cause != nil && c.cfg.failClosed || g.slots != nil && g.nested(ctx) {
			sl.u = &task[entry, *outcome]{done: make(chan struct{}), res: c.loadUnleased(ctx, []string{sl.key}, sl.id, deadline, cause)[0]}
			close(sl.u.done)
			continue
		}
		key, id := sl.key, sl.id
		t, leader, _ := g.unleased.join(entry{g.name("v:", key), c.rep}, notStarted, func(t *task[entry, *outcome]) {
			t.run = func() *outcome { return c.loadUnleased(ctx, []string{key}, id, deadline, cause)[0] }
		})
		switch sl.u = t; {
		case leader: // its own load: a task nobody else joins
			sl.u = &task[entry, *outcome]{key: entry{g.name("v:", key), c.rep}, done: make(chan struct{}), started: true}
			lead, keys = append(lead, sl), append(keys, key)
		case t == nil: // closed
			sl.u = &task[entry, *outcome]{done: make(chan struct{}), res: &outcome{err: ErrClosed}}
			close(sl.u.done)
		}
	}
	if len(lead) > 0 {
		go func() {
			for i, o := range c.loadUnleased(ctx, keys, lead[0].id, deadline, cause) {
				o.leader = lead[i].id
				lead[i].u.finish(o)
				for t := g.unleased.end(lead[i].u.key, nil, nil); t != nil; {
					t = g.unleased.end(t.key, t, t.run())
				}
			}
		}()
	}
}

// wait waits for sl's flight (or load without the lease) within ctx and the
// wait budget, and serves its outcome, joining a new flight when that one
// cannot serve it. The budget and soft timers are the call's, shared by its
// slots: one past its time counts as fired (a timer fires once).
func (c *call[T]) wait(ctx context.Context, sl *part[T], deadline, softAt time.Time, budget, soft <-chan time.Time) {
	g := c.g
	late := false // the fallback was judged against a running reload
	for {
		if now := time.Now(); budget != nil && !now.Before(deadline) {
			budget = fired
		} else if soft != nil && !now.Before(softAt) {
			soft = fired
		}
		t, leave := sl.t, func() {}
		if sl.u != nil {
			t, leave = sl.u, func() { g.unleased.leave(sl.u, false) }
		}
		// A flight that has not heard from Redis yet (pending) may turn out
		// to be one this call can join: see what its script answers.
		asked, done, softC, reloadC := t.asked, (<-chan struct{})(nil), (<-chan time.Time)(nil), (<-chan struct{})(nil)
		var unfit <-chan struct{} // a load without the lease has none
		if !sl.pending {
			asked, done, softC, unfit = nil, t.done, soft, t.unfit
			if sl.fallback != nil && sl.u == nil && !late {
				reloadC = t.asked // then the flight loads, or follows another's fill
				select {
				case <-reloadC: // answered: judged at once, before the call counts as a miss
					late = true
					if c.servedLate(ctx, sl, t) {
						leave()
						return
					}
					reloadC = nil
				default:
				}
			}
			if !sl.missed {
				// Counted once the call has joined a flight, so a miss in
				// Stats (or an observer's EventMiss) is a call already
				// waiting for it. (A call handed to a flight with its
				// read's callers is counted when the read answers, and the
				// observer hears of it when it wakes: see Guard.endRead.)
				sl.missed = true
				g.note(ctx, EventMiss, sl.key, 0, nil)
			}
		}
		select {
		case <-asked:
			c.join(ctx, []*part[T]{sl}, deadline)
		case <-done:
			o := t.res
			if errors.Is(o.err, errFlightExpired) {
				if ctx.Err() != nil {
					sl.res, sl.err = Miss, ctxErr(sl.key, ctx)
					return
				}
				if time.Now().Before(deadline) {
					// Another caller's shorter budget ended that flight;
					// this caller's budget goes on with a flight of its own.
					sl.force, sl.u = false, nil
					c.join(ctx, []*part[T]{sl}, deadline)
					continue
				}
				c.timedOut(ctx, sl, deadline)
				return
			}
			if o.leader != sl.id {
				g.note(ctx, EventCoalescedLocal, sl.key, 0, nil)
			}
			if !c.servedBy(sl, t) {
				sl.s = unknown(g)
				c.join(ctx, []*part[T]{sl}, deadline)
				continue
			}
			c.deliver(ctx, sl, o)
			return
		case <-unfit:
			// Its store would fail (see flights.unfitLocked): the call
			// joins a flight created since, whose scripts were sent after
			// the invalidation or the lease's loss, as a call arriving now
			// would, rather than wait for a load that serves it no better.
			sl.s = stored{mark: t.unfitAt, gen: counter.Unknown}
			c.join(ctx, []*part[T]{sl}, deadline)
		case <-ctx.Done():
			leave()
			sl.res, sl.err = Miss, ctxErr(sl.key, ctx)
			return
		case <-budget:
			leave()
			c.timedOut(ctx, sl, deadline)
			return
		case <-reloadC:
			late = true
			if c.servedLate(ctx, sl, t) {
				leave()
				return
			}
		case <-softC:
			// The fallback is judged again now, when it would be served.
			if fb := sl.fallback; fb != nil && c.standsIn(fb, sl) {
				if v, err := decodeValue[T](c.cfg.codec, fb); err == nil {
					leave()
					g.note(ctx, EventFailSafe, sl.key, 0, nil)
					sl.v, sl.res = v, Stale
					return
				}
			}
			soft = nil
		}
	}
}

// servedLate serves sl its fallback, marked Stale, when flight t, whose
// script has answered, is a reload this call did not start — a flight it
// joined, or its own following another process's fill — still running, and
// judge serves the fallback while a reload runs (see lateFor).
func (c *call[T]) servedLate(ctx context.Context, sl *part[T], t *task[entry, *outcome]) bool {
	select {
	case <-t.done: // it has ended: its value, not the older one
		return false
	default:
	}
	if sl.own && !t.elsewhere.Load() {
		return false
	}
	v := &view{now: time.Now().UnixMilli(), gen: sl.s.gen, tags: sl.s.tagVers, reloading: true}
	if c.cfg.judge(sl.fallback, v) != stale {
		return false
	}
	val, err := decodeValue[T](c.cfg.codec, sl.fallback)
	if err != nil {
		return false
	}
	c.g.note(ctx, EventStale, sl.key, 0, nil)
	sl.v, sl.res = val, Stale
	return true
}

// servedBy reports whether what flight t returned may serve sl, whose read
// found sl.s. admit let sl take t by the key's generation (see serves); but
// a flight created before the read may have loaded under tag versions older
// than the read found (a tag invalidated meanwhile: no generation moves),
// and then serves no call that read the newer ones: the call joins a flight
// created from now on (sl.s = unknown). Every path that serves a call from
// a flight's outcome asks it: read-your-writes after InvalidateTags rests on
// it.
func (c *call[T]) servedBy(sl *part[T], t *task[entry, *outcome]) bool {
	o := t.res
	return o.env == nil || t.serial > sl.s.mark ||
		c.cfg.judge(o.env, &view{now: time.Now().UnixMilli(), gen: sl.s.gen, tags: sl.s.tagVers}) != refused
}

// unknown is what a part knows when nothing is known of its counters: it
// joins only flights created from now on (see admit).
func unknown(g *Guard) stored {
	return stored{mark: g.flights.serial.Load(), gen: counter.Unknown}
}

// standsIn reports whether fb, sl's older value, may stand in for its load
// now (see SoftTimeout).
func (c *call[T]) standsIn(fb *envelope, sl *part[T]) bool {
	v := c.cfg.judge(fb, &view{now: time.Now().UnixMilli(), gen: sl.s.gen, tags: sl.s.tagVers})
	return v == expired || v == stale
}

// deliver serves sl with its flight's outcome.
func (c *call[T]) deliver(ctx context.Context, sl *part[T], o *outcome) {
	sl.res = Coalesced
	if o.leader == sl.id && o.loaded {
		sl.res = Miss
	}
	if o.err != nil {
		sl.err = o.err
		return
	}
	if o.env != nil && o.env.failSafe {
		c.g.note(ctx, EventFailSafe, sl.key, 0, nil)
		sl.res = Stale
	}
	if v, ok := o.val.(T); ok || o.val == nil {
		sl.v = v
		return
	}
	// Flights are kept apart by type: this cannot happen.
	sl.err = fmt.Errorf("cacheguard: key %q was loaded as %T by a concurrent call, not as %T", sl.key, o.val, sl.v)
}

// timedOut ends sl when its wait budget ended: ErrWaitTimeout, or with
// TimeoutLoad the loader's result, run without the fill lease and shared
// only with the callers of this process that arrived before it started.
// Nothing is stored.
func (c *call[T]) timedOut(ctx context.Context, sl *part[T], deadline time.Time) {
	c.g.note(ctx, EventWaitTimeout, sl.key, 0, nil)
	sl.res = Miss
	if c.cfg.onTimeout != TimeoutLoad {
		sl.err = fmt.Errorf("%w: %q after %v", ErrWaitTimeout, sl.key, c.cfg.wait)
		return
	}
	c.joinUnleased(ctx, []*part[T]{sl}, deadline, nil)
	sl.pending, sl.missed = false, true // counted as a wait timeout, not a miss
	c.wait(ctx, sl, deadline, deadline, nil, nil)
}

func ctxErr(key string, ctx context.Context) error {
	return fmt.Errorf("cacheguard: get %q: %w", key, deadlineErr(ctx))
}

func notFound(key string) error { return fmt.Errorf("%w: %q", ErrNotFound, key) }
