package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/slot"
)

// KeyErrors is the error GetMany returns when some keys failed: the error of
// each. It matches (errors.Is, errors.As) every one of them.
type KeyErrors map[string]error

func (e KeyErrors) Error() string {
	keys := slices.Sorted(maps.Keys(e))
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
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

// GetMany is Get for several keys at once, with one loader for the missing
// ones, so that each expiry still costs one load across every process:
//
//   - Near-cached keys cost nothing; the others are read in one round trip
//     (a pipeline; on a cluster one per node, in parallel).
//   - The misses take their fill leases in one script call (on a cluster one
//     per hash slot, pipelined: one round trip per node), which returns a
//     value stored meanwhile instead of a lease.
//   - load runs once, with exactly the keys whose leases this call got, under
//     a context detached from the caller (bounded by LoadTimeout), the leases
//     renewed while it runs; the values are stored in one pipeline and pushed
//     to the waiters of every process. A cold batch therefore costs three
//     round trips and one loader call.
//   - Keys whose lease another caller holds (here or in another process) are
//     waited for as Get waits: pushed values, one load per key across the
//     fleet; if that holder dies, this call takes the key over with a load
//     of that key alone.
//   - load returns the values it found; a key it leaves out does not exist:
//     it is cached as absent for the negative TTL and left out of GetMany's
//     result, with no error. A load that fails fails its keys.
//
// The result holds every key that has a value. When some keys failed (their
// load, Redis under FailClosed, the wait budget), the error is a KeyErrors
// with each key's error, next to the values of the others. With Redis
// unreachable GetMany fails open as Get does: load runs for the keys not
// found, once, and nothing is cached. GetMany serves fresh values only (it
// does not serve stale ones under ServeStale, which then waits as Wait does),
// and under FailFast a missing key fails with ErrMiss without starting a
// fill. Values are shared: treat them as read-only. Tags and ReportTo are for
// Get: GetMany refuses them (ErrInvalid). Bad input is an ErrInvalid before
// any Redis call.
func GetMany[T any](ctx context.Context, g *Guard, keys []string, load func(ctx context.Context, keys []string) (map[string]T, error), opts ...CallOption) (map[string]T, error) {
	if g == nil {
		return nil, invalid("nil Guard")
	}
	if load == nil {
		return nil, invalid("nil loader")
	}
	for _, k := range keys {
		if err := validKey(k); err != nil {
			return nil, err
		}
	}
	cfg, err := g.callConfig("batch", true, opts)
	if err != nil {
		return nil, err
	}
	if cfg.tags != nil || cfg.report != nil {
		return nil, invalid("Tags and ReportTo are not GetMany options")
	}
	b := &batch[T]{g: g, cfg: cfg, load: load, typ: reflect.TypeFor[T](), out: map[string]T{}, errs: KeyErrors{}}
	b.rep = representation(b.typ, cfg.variant)
	return b.run(ctx, slices.Compact(slices.Sorted(slices.Values(keys))))
}

// batch is one GetMany.
type batch[T any] struct {
	g    *Guard
	cfg  config
	load func(ctx context.Context, keys []string) (map[string]T, error)
	typ  reflect.Type
	rep  string

	mu   sync.Mutex // guards out and errs once waits run concurrently
	out  map[string]T
	errs KeyErrors
}

type batchKey struct {
	key    string
	values string // the values hash (what a read needs)
	ks     keySet // every name, set for the misses only
	near   nearSnap
	b      []byte // what the read found
	r      leaseReply
}

func (b *batch[T]) run(ctx context.Context, keys []string) (map[string]T, error) {
	g := b.g
	start := time.Now()
	var todo []*batchKey
	for _, k := range keys {
		if n := g.near; n != nil {
			if v, _, ok := nearGet[T](n, k, b.typ, b.cfg.variant, nil, start); ok {
				g.noteNearHit(ctx, k)
				b.out[k] = v
				continue
			}
		}
		bk := &batchKey{key: k, values: g.cfg.prefix + "v:{" + hashTag(k) + "}"}
		if g.near != nil {
			bk.near = g.near.snap(k, nil, start)
		}
		todo = append(todo, bk)
	}
	if len(todo) == 0 {
		return b.result()
	}
	deadline := start.Add(b.cfg.wait)

	// Round trip 1: read every key.
	if err := b.redis(ctx, deadline, func(rctx context.Context) error { return b.read(rctx, todo) }); err != nil {
		return b.failed(ctx, todo, err)
	}
	var missed []*batchKey
	for _, bk := range todo {
		if bk.b != nil && b.serve(ctx, bk, bk.b, true) {
			continue
		}
		g.note(ctx, EventMiss, bk.key, 0, nil)
		bk.ks = g.keys(bk.key, b.rep)
		missed = append(missed, bk)
	}
	if len(missed) == 0 {
		return b.result()
	}
	if b.cfg.policy == policyFailFast {
		for _, bk := range missed {
			b.fail(bk.key, fmt.Errorf("%w: %q", ErrMiss, bk.key))
		}
		return b.result()
	}

	// Round trip 2: the misses' leases.
	tok := token()
	if err := b.redis(ctx, deadline, func(rctx context.Context) error { return b.lease(rctx, missed, tok) }); err != nil {
		return b.failed(ctx, missed, err)
	}
	var mine, held []*batchKey
	for _, bk := range missed {
		switch {
		case bk.r.fresh:
			if !b.serve(ctx, bk, bk.r.value, false) {
				held = append(held, bk) // unreadable: ask as Get does
			}
		case bk.r.granted:
			mine = append(mine, bk)
		default:
			held = append(held, bk)
		}
	}
	var wg sync.WaitGroup
	for _, bk := range held {
		wg.Go(func() { b.wait(ctx, bk) })
	}
	if len(mine) > 0 {
		b.fill(ctx, mine, tok)
	}
	wg.Wait()
	return b.result()
}

func (b *batch[T]) result() (map[string]T, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.errs) > 0 {
		return b.out, b.errs
	}
	return b.out, nil
}

func (b *batch[T]) fail(key string, err error) {
	b.mu.Lock()
	b.errs[key] = err
	b.mu.Unlock()
}

func (b *batch[T]) set(key string, v T) {
	b.mu.Lock()
	b.out[key] = v
	b.mu.Unlock()
}

// redis runs f, a batch's round trip, bounded by ctx and the wait budget
// whatever the client's timeouts (on a goroutine unless the client honours
// context deadlines, as a Get's read).
func (b *batch[T]) redis(ctx context.Context, deadline time.Time, f func(context.Context) error) error {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if b.g.ctxDeadlines {
		err := f(rctx)
		if err != nil && rctx.Err() != nil {
			return errors.Join(errBudget, rctx.Err())
		}
		return err
	}
	done := make(chan error, 1)
	tctx, finish, ok := b.g.track(context.WithoutCancel(ctx))
	if !ok {
		return ErrClosed
	}
	go func() {
		defer finish()
		done <- f(tctx)
	}()
	select {
	case err := <-done:
		return err
	case <-rctx.Done():
		return errors.Join(errBudget, rctx.Err())
	}
}

// read reads every key in one round trip: one script on a single server,
// a pipeline of HGETs on a cluster (one per node).
func (b *batch[T]) read(ctx context.Context, keys []*batchKey) error {
	if !b.g.hub.Sharded() {
		names := make([]string, len(keys))
		for i, bk := range keys {
			names[i] = bk.values
		}
		vals, err := readManyScript.Eval(ctx, b.g.rdb, names, b.rep).Slice() // EVAL: one round trip even on a server that has not seen it
		if err != nil {
			return err
		}
		if len(vals) != len(keys) {
			return fmt.Errorf("cacheguard: %d values read for %d keys", len(vals), len(keys))
		}
		for i, v := range vals {
			if s, ok := v.(string); ok {
				keys[i].b = bytesOf(s)
			}
		}
		return nil
	}
	pipe := b.g.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(keys))
	for i, bk := range keys {
		cmds[i] = pipe.HGet(ctx, bk.values, b.rep)
	}
	_, _ = pipe.Exec(ctx) // each command's error is read below
	for i, c := range cmds {
		v, err := c.Result()
		switch {
		case err == nil:
			keys[i].b = bytesOf(v)
		case !errors.Is(err, redis.Nil):
			return err
		}
	}
	return nil
}

// lease runs the batch get-or-lease script: one call per hash slot (one in
// all on a single server), pipelined.
func (b *batch[T]) lease(ctx context.Context, keys []*batchKey, tok string) error {
	groups := map[int][]*batchKey{}
	if b.g.hub.Sharded() {
		for _, bk := range keys {
			s := slot.Of(bk.ks.gen)
			groups[s] = append(groups[s], bk)
		}
	} else {
		groups[0] = keys
	}
	pipe := b.g.rdb.Pipeline()
	type call struct {
		cmd  *redis.Cmd
		keys []*batchKey
	}
	calls := make([]call, 0, len(groups))
	now := time.Now().UnixMilli()
	for _, gk := range groups {
		names := make([]string, 0, 3*len(gk))
		args := []any{tok, b.cfg.lease.Milliseconds(), now, genTTL.Milliseconds(), "0"}
		for _, bk := range gk {
			names = append(names, bk.ks.values, bk.ks.lease, bk.ks.gen)
			args = append(args, bk.ks.field)
		}
		calls = append(calls, call{getLeaseManyScript.Eval(ctx, pipe, names, args...), gk})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	for _, c := range calls {
		replies, err := c.cmd.Slice()
		if err != nil {
			return err
		}
		if len(replies) != len(c.keys) {
			return fmt.Errorf("cacheguard: %d get-or-lease replies for %d keys", len(replies), len(c.keys))
		}
		for i, r := range replies {
			v, _ := r.([]any)
			if c.keys[i].r, err = parseLeaseReply(v); err != nil {
				return err
			}
		}
	}
	return nil
}

// serve takes a stored envelope of bk as its value when it is fresh (or a
// cached absence: the key is left out); false when it is not servable.
func (b *batch[T]) serve(ctx context.Context, bk *batchKey, raw []byte, hit bool) bool {
	g := b.g
	env, err := decodeEnvelope(raw)
	if err != nil {
		g.note(ctx, EventDecodeError, bk.key, 0, err)
		return false
	}
	if time.Now().UnixMilli() >= env.freshUntil {
		return false
	}
	if hit {
		g.note(ctx, EventHit, bk.key, 0, nil)
	} else {
		g.note(ctx, EventCoalescedRemote, bk.key, 0, nil)
	}
	if env.negative {
		g.note(ctx, EventNegativeHit, bk.key, 0, nil)
		return true
	}
	v, err := decodeValue[T](b.cfg.codec, &env)
	if err != nil {
		g.note(ctx, EventDecodeError, bk.key, 0, err)
		return false
	}
	b.set(bk.key, v)
	if g.near != nil {
		g.near.put(bk.near, bk.key, b.typ, b.cfg.variant, nil, v, &env)
	}
	return true
}

// wait gets a key whose fill another caller holds, as Get would: pushed
// value, or its lease taken over (then loaded alone).
func (b *batch[T]) wait(ctx context.Context, bk *batchKey) {
	one := func(ctx context.Context) (T, error) {
		m, err := b.load(ctx, []string{bk.key})
		if err != nil {
			var zero T
			return zero, err
		}
		v, ok := m[bk.key]
		if !ok {
			return v, fmt.Errorf("%w: %q", ErrNotFound, bk.key)
		}
		return v, nil
	}
	opts := []CallOption{callOption(func(c *config) { *c = b.cfg })}
	v, err := Get(ctx, b.g, bk.key, one, opts...)
	switch {
	case err == nil:
		b.set(bk.key, v)
	case errors.Is(err, ErrNotFound):
	default:
		b.fail(bk.key, err)
	}
}

// fill loads the keys whose leases this call holds, with one call of load,
// and stores what it returned (absent keys as absences) in one pipeline.
func (b *batch[T]) fill(ctx context.Context, keys []*batchKey, tok string) {
	g := b.g
	lctx, done, ok := g.track(context.WithoutCancel(ctx))
	if !ok {
		for _, bk := range keys {
			b.fail(bk.key, ErrClosed)
		}
		return
	}
	defer done()
	stop := b.renew(lctx, keys, tok)
	names := make([]string, len(keys))
	for i, bk := range keys {
		names[i] = bk.key
	}
	start := time.Now()
	vals, err := b.runLoader(lctx, names)
	stop()
	took := time.Since(start)
	now := time.Now()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.cfg.lease)
	defer cancel()

	pipe := g.rdb.Pipeline()
	type stored struct {
		bk  *batchKey
		v   T
		env *envelope
		cmd *redis.Cmd
	}
	var writes []stored
	for _, bk := range keys {
		l := lease{gen: bk.r.gen, token: tok}
		if err != nil {
			msg := "e" + tok + " " + err.Error()
			if context.Cause(lctx) == ErrClosed || errors.Is(err, ErrClosed) {
				msg = "h" + tok + " "
			}
			releaseScript.Eval(sctx, pipe, []string{bk.ks.lease}, l.String(), bk.ks.wake, g.pub, msg)
			b.fail(bk.key, err)
			continue
		}
		v, found := vals[bk.key]
		var env *envelope
		var ttl time.Duration
		switch {
		case found:
			payload, merr := encodeValue(b.cfg.codec, v)
			if merr != nil {
				merr = fmt.Errorf("cacheguard: encode %q: %w", bk.key, merr)
				releaseScript.Eval(sctx, pipe, []string{bk.ks.lease}, l.String(), bk.ks.wake, g.pub, "e"+tok+" "+merr.Error())
				b.fail(bk.key, merr)
				continue
			}
			b.set(bk.key, v)
			fresh := jittered(b.cfg.ttl, b.cfg.jitter)
			ttl = fresh + b.cfg.staleWindow
			env = &envelope{freshUntil: now.UnixMilli() + fresh.Milliseconds(), staleUntil: now.UnixMilli() + ttl.Milliseconds(), delta: took, gen: l.gen, payload: payload}
		case b.cfg.negTTL > 0:
			ttl = jittered(b.cfg.negTTL, b.cfg.jitter)
			env = &envelope{freshUntil: now.UnixMilli() + ttl.Milliseconds(), staleUntil: now.UnixMilli() + ttl.Milliseconds(), delta: took, gen: l.gen, negative: true}
		default:
			releaseScript.Eval(sctx, pipe, []string{bk.ks.lease}, l.String(), bk.ks.wake, g.pub, "n"+tok+" ")
			continue
		}
		cmd := fillScript.Eval(sctx, pipe, []string{bk.ks.values, bk.ks.lease, bk.ks.gen},
			l.String(), env.encode(), max(ttl.Milliseconds(), 1), bk.ks.wake, g.pub, tok, fmt.Sprint(l.gen), bk.ks.field, now.UnixMilli(),
			g.ncChannel, g.origin+" f"+bk.key)
		writes = append(writes, stored{bk, v, env, cmd})
	}
	if _, perr := pipe.Exec(sctx); perr != nil && !errors.Is(perr, redis.Nil) {
		g.note(ctx, EventRedisError, keys[0].key, 0, perr)
	}
	for _, w := range writes {
		if n, err := w.cmd.Int64(); err != nil || n != 1 || w.env.negative || g.near == nil {
			continue
		}
		g.near.drop(w.bk.key)
		g.near.put(g.near.snap(w.bk.key, nil, time.Now()), w.bk.key, b.typ, b.cfg.variant, nil, w.v, w.env)
	}
}

// runLoader runs load under ctx bounded by the load timeout, turning a panic
// into a *PanicError, and counts one load.
func (b *batch[T]) runLoader(ctx context.Context, keys []string) (vals map[string]T, err error) {
	start := time.Now()
	lctx, cancel := context.WithTimeout(ctx, b.cfg.loadTimeout)
	defer func() {
		cancel()
		if p := recover(); p != nil {
			err = newPanicError(p)
		}
		b.g.note(ctx, EventLoad, strings.Join(keys, ","), time.Since(start), err)
	}()
	return b.load(lctx, keys)
}

// renew keeps the leases of keys alive every third of the lease, in one
// pipeline, until the returned function is called.
func (b *batch[T]) renew(ctx context.Context, keys []*batchKey, tok string) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	leaseFor := b.cfg.lease
	go func() {
		defer close(done)
		t := time.NewTicker(leaseFor / 3)
		defer t.Stop()
		for {
			select {
			case <-quit:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, cancel := context.WithTimeout(ctx, leaseFor)
			pipe := b.g.rdb.Pipeline()
			for _, bk := range keys {
				l := lease{gen: bk.r.gen, token: tok}
				renewScript.Eval(rctx, pipe, []string{bk.ks.lease, bk.ks.gen}, l.String(), leaseFor.Milliseconds(), fmt.Sprint(l.gen))
			}
			_, _ = pipe.Exec(rctx) // a lost lease shows at the store
			cancel()
		}
	}()
	return func() { close(quit); <-done }
}

// failed handles a Redis failure of the batch for keys: fail closed, or fail
// open (load them once, uncached).
func (b *batch[T]) failed(ctx context.Context, keys []*batchKey, err error) (map[string]T, error) {
	g := b.g
	switch {
	case errors.Is(err, ErrClosed):
		for _, bk := range keys {
			b.fail(bk.key, ErrClosed)
		}
		return b.result()
	case ctx.Err() != nil:
		for _, bk := range keys {
			b.fail(bk.key, fmt.Errorf("cacheguard: get %q: %w", bk.key, ctx.Err()))
		}
		return b.result()
	case errors.Is(err, errBudget):
		for _, bk := range keys {
			g.note(ctx, EventWaitTimeout, bk.key, 0, nil)
			b.fail(bk.key, fmt.Errorf("%w: %q after %v", ErrWaitTimeout, bk.key, b.cfg.wait))
		}
		return b.result()
	}
	g.note(ctx, EventRedisError, keys[0].key, 0, err)
	if b.cfg.failClosed {
		for _, bk := range keys {
			b.fail(bk.key, errors.Join(fmt.Errorf("%w: %q", ErrUnavailable, bk.key), err))
		}
		return b.result()
	}
	names := make([]string, len(keys))
	for i, bk := range keys {
		names[i] = bk.key
	}
	sort.Strings(names)
	g.note(ctx, EventFailOpen, names[0], 0, err)
	vals, lerr := b.runLoader(context.WithoutCancel(ctx), names)
	for _, k := range names {
		if lerr != nil {
			b.fail(k, lerr)
		} else if v, ok := vals[k]; ok {
			b.set(k, v)
		}
	}
	return b.result()
}
