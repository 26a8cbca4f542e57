package locks

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/rid"
	"github.com/cacheguard/cacheguard/internal/slot"
	"github.com/cacheguard/cacheguard/internal/wake"
)

var (
	//go:embed fence.lua
	fenceLua string
	//go:embed queue.lua
	queueLua string
	//go:embed acquire.lua
	acquireBody string
	//go:embed release.lua
	releaseBody string
	//go:embed extend.lua
	extendLua string

	// acquire and release issue fence tokens and drop dead waiters: one
	// definition of each, prepended.
	acquireLua = fenceLua + queueLua + acquireBody
	releaseLua = fenceLua + queueLua + releaseBody
)

// placeTTL is how long a waiter's place in a lock's queue lasts without being
// refreshed; a waiter refreshes it at about half that. A waiter that dies thus
// stops blocking the queue within placeTTL.
const placeTTL = 2 * time.Second

// Locker is what ginmw, gormplugin and applications need of a lock service;
// *Client and *Redlock implement it.
type Locker interface {
	// Lock waits until the lock is held, the wait budget ends, or ctx ends.
	Lock(ctx context.Context, name string, opts ...CallOption) (*Lock, error)
	// TryLock makes one attempt.
	TryLock(ctx context.Context, name string, opts ...CallOption) (*Lock, error)
}

var _ Locker = (*Client)(nil)

// Client takes locks on one Redis deployment: a single server, a Sentinel-managed
// master (redis.NewFailoverClient) or a Redis Cluster. It is safe for concurrent
// use; make one per process and share it. Close stops its background work.
type Client struct {
	rdb  redis.UniversalClient
	run  *rcmd.Runner // every command of the client: bounded by the command timeout
	cfg  config
	hub  *wake.Hub
	ren  *renewer
	b    *batcher
	pubV any    // "PUBLISH", or "SPUBLISH" on a cluster
	id   string // names this client's wake channels (see channel)
	idV  any    // id, boxed once

	life   life     // Close and Shutdown
	late   lateWork // work detached from its callers' deadlines (see detach, giveBack)
	scopes scopes   // owners' holdings in this process (WithOwner)

	mu    sync.Mutex       // guards gates
	gates map[string]*gate // per lock key: one waiting caller per process in default mode

	names nameCache // the keys of recently used names under the client's prefix
}

// nameCache keeps the keys of the lock names this client used most recently,
// built and boxed once: a lock cycle on a hot name then allocates nothing for
// them. It holds at most maxCachedNames names; beyond that each new name
// evicts the oldest one (first in, first out), so a working set of hot names
// smaller than the bound stays cached whatever passes through beside it.
type nameCache struct {
	m    sync.Map   // name -> *nameKeys
	mu   sync.Mutex // guards ring and next
	ring []string   // the cached names; once full, a ring whose oldest is at next
	next int
}

// nameKeys are the keys of one name (see keys), and the same boxed.
type nameKeys struct {
	ks [4]string
	kv [4]any
}

// maxCachedNames bounds a client's name cache: some 400 bytes a name (with a
// short name), so about 6 MB when full.
const maxCachedNames = 16384

func (nc *nameCache) get(prefix, name string) ([]string, []any) {
	if v, ok := nc.m.Load(name); ok {
		k := v.(*nameKeys)
		return k.ks[:], k.kv[:]
	}
	k := &nameKeys{}
	for i, key := range keys(prefix, name) {
		k.ks[i], k.kv[i] = key, key
	}
	if v, loaded := nc.m.LoadOrStore(name, k); loaded {
		k = v.(*nameKeys) // another caller cached it meanwhile
		return k.ks[:], k.kv[:]
	}
	nc.mu.Lock()
	if len(nc.ring) < maxCachedNames {
		nc.ring = append(nc.ring, name)
	} else {
		nc.m.Delete(nc.ring[nc.next])
		nc.ring[nc.next] = name
		nc.next = (nc.next + 1) % maxCachedNames
	}
	nc.mu.Unlock()
	return k.ks[:], k.kv[:]
}

// New returns a Client on rdb with the given defaults. It panics with a
// "locks:" message when rdb is nil or an option is invalid (programmer error).
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	if rdb == nil {
		panic("locks: New called with a nil redis client")
	}
	cfg := defaults()
	if err := applyAll(&cfg, opts); err != nil {
		panic(err.Error())
	}
	if err := clientValidate(&cfg); err != nil {
		panic(err.Error())
	}
	cfg.pack()
	run := rcmd.New(rdb, cfg.cmdTimeout)
	c := &Client{rdb: rdb, run: run, cfg: cfg, hub: wake.New(rdb), b: newBatcher(run), gates: map[string]*gate{}, pubV: "PUBLISH"}
	c.id = rid.New()[:16]
	c.idV = c.id
	if c.hub.Sharded() {
		c.pubV = "SPUBLISH"
	}
	c.ren = newRenewer(c.renewBatch)
	c.life.init()
	return c
}

// Close closes the client at once: new calls fail with ErrClosed, waiting
// Lock calls end with ErrClosed (their places in the locks' queues given
// back), a grant that arrives meanwhile is given back, and once those calls
// have returned, the renewal loop and the shared subscription stop. Locks
// still held stop being renewed and count as lost (their Lost channels close
// with ErrClosed, reported to the observer); they expire in Redis when their
// lease ends, or when their Unlock is called — also while Close runs: a
// release made once Close began goes to Redis on its caller's goroutine,
// under its context. Clean-ups still queued for a shared round trip are
// dropped, and so is one that a call makes past its context after Close (an
// Unlock whose release failed: the lock expires with its lease). A shared
// round trip already on the wire is waited for: when Redis stalls, until its
// bound (two CommandTimeouts at most). So is an acquisition with Replicas
// whose caller returned while its WAIT was on the wire: up to the WAIT
// timeout plus that bound, until its grant is given back (a grant nobody was
// given is never left to its lease). Close does not close rdb, and always
// returns nil; see Shutdown for the graceful close.
func (c *Client) Close() error {
	c.life.hurryUp()
	_ = c.Shutdown(context.Background()) // held locks are reported through Lost and the observer
	return nil
}

// Shutdown closes the client gracefully, for a rolling restart: as Close, it
// refuses new calls and ends waiting Lock calls at once with ErrClosed
// (withdrawn from the locks' queues, so the next holder elsewhere is granted
// at once); then, until ctx ends, it keeps renewing the locks still held while
// the application finishes with them (a nested acquisition of a scope still
// held re-enters, see WithOwner), and sends the releases still queued. It
// returns nil once every lock was Unlocked; when ctx ends first, the locks
// still held are dropped as Close drops them and the error (matching
// ErrStillHeld and ctx's error) names them. Close cuts a Shutdown short.
//
// Past ctx it waits only for what is on the wire: a renewal, and the calls
// in progress when it began with the clean-ups they leave (an attempt, its
// give-back under the caller's context, and that give-back once more as
// late work when it failed). On a Redis that does not answer, each takes up
// to its command bound (twice CommandTimeout, plus the WAIT timeout with
// Replicas), so Shutdown returns within one bound after ctx ends or three
// after it began, whichever is later.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.life.shutdown(ctx, c.ren.waitEmpty, c.b.drain, func() {
		// Renewal stops first: past ctx, what is still held is dropped, and
		// a renewal sent while the late work ends would add its own bound.
		c.ren.close()
		c.late.wait() // bounded by the command and WAIT timeouts
		c.hub.Close()
		c.b.close()
	})
}

// Held returns how many locks this client is keeping alive.
func (c *Client) Held() int { return c.ren.len() }

func (c *Client) renewer() *renewer { return c.ren }

// TryLock makes one attempt to take the lock name; ErrNotObtained (as a
// *NotObtainedError with the holder's remaining lease) when it is held.
func (c *Client) TryLock(ctx context.Context, name string, opts ...CallOption) (*Lock, error) {
	cfg, err := c.callConfig(name, opts)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, name, cfg, false)
}

// Lock takes the lock name, waiting while it is held until it is released to
// this caller, the wait budget ends (WaitBudget; 30s by default) or ctx ends.
// Waiting is woken by push: a release hands the lock straight to the waiter
// that has waited longest and tells it, so a waiter costs no polling.
func (c *Client) Lock(ctx context.Context, name string, opts ...CallOption) (*Lock, error) {
	cfg, err := c.callConfig(name, opts)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, name, cfg, cfg.wait > 0)
}

func (c *Client) callConfig(name string, opts []CallOption) (*config, error) {
	if c == nil {
		return nil, invalid("nil Client")
	}
	if err := validName(name); err != nil {
		return nil, err
	}
	if len(opts) == 0 {
		return &c.cfg, nil
	}
	p := new(config)
	*p = c.cfg
	if err := applyAll(p, opts); err != nil {
		return nil, err
	}
	if err := clientValidate(p); err != nil {
		return nil, err
	}
	p.packFrom(&c.cfg)
	return p, nil
}

// clientValidate validates a Client's configuration: cfg.validate, and none
// of a Redlock's options.
func clientValidate(cfg *config) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	switch {
	case cfg.nodeTimeout != 0:
		return invalid("NodeTimeout is a Redlock option")
	case cfg.drift != defaultDrift:
		return invalid("Drift is a Redlock option")
	}
	return nil
}

// keys returns the lock's keys, all under one hash tag so they share a slot:
// lock, fence counter, waiter queue, waiter deadlines (one allocation). The
// tag is the name itself (cg:lock:{repo:42}), readable, unless the name
// contains '}', which would end the tag early (a name starting with '}' would
// leave it empty, and Redis would hash each whole key): then the tag is a
// hash of the name and the name follows it (cg:lock:{#1f0c…}a}b), so every
// name keeps its keys in one slot and distinct names keep distinct keys.
func keys(prefix, name string) []string {
	tag, rest := slot.Tag(name)
	kinds := [4]string{"lock:{", "fence:{", "q:{", "qt:{"}
	n := 0
	for _, k := range kinds {
		n += len(prefix) + len(k) + len(tag) + 1 + len(rest)
	}
	var b strings.Builder
	b.Grow(n)
	var ends [4]int
	for i, k := range kinds {
		b.WriteString(prefix)
		b.WriteString(k)
		b.WriteString(tag)
		b.WriteByte('}')
		b.WriteString(rest)
		ends[i] = b.Len()
	}
	all := b.String()
	return []string{all[:ends[0]], all[ends[0]:ends[1]], all[ends[1]:ends[2]], all[ends[2]:]}
}

// channel is where this client's waiters for a lock hear of hand-offs: the
// lock key plus ":w:" and the client's id, so that it shares the lock's hash
// slot and a hand-off wakes only the process it is for (see release.lua).
func (c *Client) channel(lockKey string) string { return lockKey + ":w:" + c.id }

type attemptResult struct {
	ok        bool
	fence     uint64
	fenceV    any  // the token as the reply carried it (a string), for release.lua
	reentered bool // joined a holding of its owner's (acquire.lua decides, also for a retry)
	pttl      time.Duration
}

// attempt runs the acquire script once; member is the caller's place in the
// queue ("" when it does not queue).
func (c *Client) attempt(ctx context.Context, ks []string, kv []any, owner, acq any, cfg *config, member string) (attemptResult, error) {
	packed := cfg.argsTryV
	if member != "" {
		packed = cfg.argsWaitV
	}
	if cfg.replicas > 0 {
		args := []any{owner, acq, cfg.leaseV, cfg.retentionV, packed, c.idV}
		return c.detach(ctx, cfg, func(ctx context.Context) (attemptResult, error) {
			return c.attemptWait(ctx, ks, kv, args, owner.(string), cfg)
		}, func(ctx context.Context) { c.giveBack(ctx, kv, owner, acq, cfg, member, false) })
	}
	// An attempt whose caller gave up before the reply came may still have
	// taken the lock or a place in its queue: give both back.
	cleanup := func() ([]any, func() bool) { return c.giveBackCall(kv, owner, acq, cfg, member), nil }
	v, err := acquireS.runVia(ctx, c.b, cleanup, kv, owner, acq, cfg.leaseV, cfg.retentionV, packed, c.idV).Result()
	if err != nil {
		return attemptResult{}, err
	}
	return parseAttempt(v)
}

// parseAttempt reads acquire.lua's reply: a fence token alone for a grant
// that began the holding, else {1, fence, holds} for a re-entry or {0, pttl,
// queued} (a fence is a decimal string).
func parseAttempt(reply any) (attemptResult, error) {
	if s, ok := reply.(string); ok {
		f, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return attemptResult{}, fmt.Errorf("locks: unexpected acquire reply %q", s)
		}
		return attemptResult{ok: true, fence: f, fenceV: reply}, nil
	}
	v, _ := reply.([]any)
	if len(v) < 2 {
		return attemptResult{}, fmt.Errorf("locks: unexpected acquire reply %v", reply)
	}
	a, _ := v[0].(int64)
	if a == 1 {
		s, _ := v[1].(string)
		f, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return attemptResult{}, fmt.Errorf("locks: unexpected acquire reply %v", v)
		}
		return attemptResult{ok: true, fence: f, fenceV: v[1], reentered: true}, nil
	}
	b, _ := v[1].(int64)
	return attemptResult{pttl: time.Duration(b) * time.Millisecond}, nil
}

// attemptWait is attempt with Replicas: see withWait. When too few
// replicas acknowledged a grant, the grant is given back.
func (c *Client) attemptWait(ctx context.Context, ks []string, kv []any, args []any, owner string, cfg *config) (attemptResult, error) {
	cmd, acks, werr := c.withWait(ctx, ks[0], acquireS.call(kv, args), cfg)
	v, err := cmd.Result()
	if err != nil {
		return attemptResult{}, err
	}
	res, err := parseAttempt(v)
	if err != nil || !res.ok {
		return res, err
	}
	if err := c.acked(ctx, kv, owner, args[1], cfg, acks, werr); err != nil {
		return attemptResult{}, err
	}
	return res, nil
}

// handedWait makes a lock handed to this waiter honour Replicas: the
// hand-off was written by the releaser's connection, and WAIT counts only the
// writes of its own, so the waiter writes to the lock itself (restoring the
// full lease) and WAITs for that; replicas apply writes in order, so they
// then have the hand-off too. When too few acknowledge, the lock is given
// back (handed on).
func (c *Client) handedWait(ctx context.Context, kv []any, owner, acq any, cfg *config) error {
	undo := func(ctx context.Context) { c.giveBack(ctx, kv, owner, acq, cfg, "", false) }
	_, err := c.detach(ctx, cfg, func(ctx context.Context) (attemptResult, error) {
		cmd, acks, werr := c.withWait(ctx, kv[0].(string), extendS.call(kv[:1], []any{owner, cfg.lease.Milliseconds(), acq, int64(1)}), cfg)
		n, err := cmd.Int64()
		switch {
		case err != nil:
			undo(ctx)
			return attemptResult{}, err
		case n != 1:
			return attemptResult{}, ErrNotHeld // lost before it was confirmed
		}
		return attemptResult{}, c.acked(ctx, kv, owner, acq, cfg, acks, werr)
	}, undo)
	return err
}

// detach runs f — a grant's script and its WAIT, sent on one connection (see
// withWait) — under ctx, unless ctx's deadline would cut them: go-redis
// closes the connection of a command its context cut, and on a starved host
// the redials feed the overload. Then f runs on a goroutine of the client's
// (Close waits for it) under ctx without its deadline, bounded by the command
// and WAIT timeouts, and the caller returns at its deadline with ctx's error;
// once f has returned, undo gives back whatever it was granted or queued for
// (giving back what is not held changes nothing). This is the batcher's rule
// for every other script call (see batcher.do). Once closing has begun, f
// runs under ctx: Close's wait for these goroutines must not race a new one
// (an acquisition that began before cannot be past closing's barrier, and
// one that begins after sees closed).
func (c *Client) detach(ctx context.Context, cfg *config, f func(context.Context) (attemptResult, error), undo func(context.Context)) (attemptResult, error) {
	if c.life.closed.Load() || !c.run.Cuts(ctx, cfg.replicaTimeout) {
		return f(ctx)
	}
	type result struct {
		res attemptResult
		err error
	}
	done := make(chan result, 1)
	var state atomic.Int32 // waiting, answered or abandoned, as a batcher's pending call
	dctx := context.WithoutCancel(ctx)
	if !c.late.Go(func() {
		res, err := f(dctx)
		if state.CompareAndSwap(waiting, answered) {
			done <- result{res, err}
			return
		}
		undo(dctx)
	}) {
		return f(ctx) // Shutdown has stopped taking late work
	}
	select {
	case r := <-done:
		return r.res, r.err
	case <-ctx.Done():
		if state.CompareAndSwap(waiting, abandoned) {
			return attemptResult{}, ctx.Err()
		}
		r := <-done // answered meanwhile: the reply is the truth
		return r.res, r.err
	}
}

// acked checks a WAIT's reply; with too few acknowledgements the grant is
// given back: a failover now could grant the lock twice.
func (c *Client) acked(ctx context.Context, kv []any, owner, acq any, cfg *config, acks int, werr error) error {
	if werr == nil && acks >= cfg.replicas {
		return nil
	}
	c.giveBack(ctx, kv, owner, acq, cfg, "", false)
	if werr != nil {
		return werr
	}
	return &ReplicaError{Want: cfg.replicas, Got: acks}
}

// withWait sends call (a script's command line) and WAIT in one pipeline on
// one connection to the master that owns key: WAIT only counts the writes of
// its own connection, and a keyless WAIT routed to another master of a
// cluster would succeed without waiting for anything. A node without the
// script gets the pipeline again with EVAL (as everywhere, see script). It
// returns the script's reply, and the acknowledgements (or WAIT's error).
func (c *Client) withWait(ctx context.Context, key string, call []any, cfg *config) (*redis.Cmd, int, error) {
	var node *redis.Client
	switch r := c.rdb.(type) {
	case *redis.ClusterClient:
		n, err := r.MasterForKey(ctx, key)
		if err != nil {
			cmd := redis.NewCmd(ctx, call...)
			cmd.SetErr(err)
			return cmd, 0, err
		}
		node = n
	case *redis.Client:
		node = r
	default:
		cmd := redis.NewCmd(ctx, call...)
		err := invalid("Replicas needs a *redis.Client, a failover client or a *redis.ClusterClient, not %T", c.rdb)
		cmd.SetErr(err)
		return cmd, 0, err
	}
	cmds := []*redis.Cmd{redis.NewCmd(ctx, call...), redis.NewCmd(ctx, "WAIT", cfg.replicas, cfg.replicaTimeout.Milliseconds())}
	exec(ctx, c.run, node, cmds, cfg.replicaTimeout, true) // WAIT waits on the server for up to its timeout
	acks, err := cmds[1].Int()
	return cmds[0], acks, err
}

// giveBack gives back what an acquisition attempt of owner (acquisition id
// acq) may hold in Redis: its hold — granted, handed to it, or re-entered —
// and its place in the lock's queue (member, or ""). Giving back what is not
// held changes nothing, so it is safe whenever an attempt's outcome is
// unknown. It is the one clean-up of every acquisition abandoned, refused
// (too few replicas, a lost scope, a closing client) or given up while
// waiting: a grant nobody will use is handed on at once, never left to run
// out its lease. It waits for Redis, within ctx, unless async or ctx has
// ended (a call never outlives its context or budget to clean up after
// itself) — except while the client closes, whose callers' clean-ups Close
// waits for, so that nothing is left queued behind a closed client; when
// that fails, or without waiting, the release travels with the batcher's
// next pipeline.
func (c *Client) giveBack(ctx context.Context, kv []any, owner, acq any, cfg *config, member string, async bool) {
	call := c.giveBackCall(kv, owner, acq, cfg, member)
	if !async && ctx.Err() == nil && c.b.do(ctx, call, nil).Err() == nil {
		return
	}
	// Past ctx, never on the caller's goroutine: while the client closes
	// (whose batcher drops the clean-ups it has queued) it is sent as late
	// work, which Close waits for, so the places of the calls it ended are
	// given back by the time it returns; else with the next round trip. (A
	// wait that Close ended gives back under its caller's own context: see
	// life.backCtx.)
	if !async && c.life.closed.Load() && c.late.Go(func() { c.b.do(context.Background(), call, nil) }) {
		return
	}
	c.b.later(call)
}

// giveBackCall is giveBack's release.lua call. It ends the acquisition for
// good: its last argument has the script leave a tombstone that refuses any
// request of the attempt reaching Redis after it (see release.lua), for as
// long as one may (tombLifeV).
func (c *Client) giveBackCall(kv []any, owner, acq any, cfg *config, member string) []any {
	return releaseS.call(kv, []any{owner, acq, member, cfg.argsReleaseV, c.pubV, "", "", tombLifeV})
}

// acquire is a Lock (wait) or TryLock call. A waiting call whose grant came
// back spent (ErrNoValidity: its reply came after its lease ran out, and it
// was given back) asks again, as a new acquisition, within its context and
// wait budget, as a Redlock's Lock does: a late reply is Redis's latency, not
// contention.
func (c *Client) acquire(ctx context.Context, name string, cfg *config, wait bool) (*Lock, error) {
	start := time.Now()
	for {
		lk, err := c.acquireFrom(ctx, name, cfg, wait, start)
		if !wait || !errors.Is(err, ErrNoValidity) || ctx.Err() != nil || time.Since(start) >= cfg.wait {
			return lk, err
		}
	}
}

func (c *Client) acquireFrom(ctx context.Context, name string, cfg *config, wait bool, start time.Time) (*Lock, error) {
	owner, _ := OwnerFrom(ctx)
	reentrant := owner != ""
	entered := c.life.enter(ctx, reentrant)
	if entered {
		defer c.life.leave()
	}
	closing := !entered || c.life.closed.Load()
	var ov, acq any
	if reentrant {
		ov, acq = owner, rid.New()
	} else {
		owner = rid.New()
		ov = owner
		acq = ov // a fresh owner is its own acquisition id
	}
	var ks []string
	var kv []any
	if cfg.prefix == c.cfg.prefix {
		ks, kv = c.names.get(cfg.prefix, name)
	} else {
		ks = keys(cfg.prefix, name)
		kv = boxKeys(ks)
	}
	a := &acquisition{c: c, name: name, cfg: cfg, start: start, ks: ks, kv: kv, owner: owner, ov: ov, acq: acq, scoped: reentrant}
	fail := func(pttl time.Duration, err error) (*Lock, error) { return a.fail(ctx, pttl, err) }
	if closing && !reentrant {
		return fail(0, ErrClosed)
	}
	if err := ctx.Err(); err != nil {
		return fail(0, err)
	}
	// A nested acquisition (this owner's scope of the name has Locks not yet
	// Unlocked) may only re-enter that holding: it makes one attempt and
	// never waits, and fails with ErrLost when the holding is gone.
	var sc *scope
	if reentrant {
		var err error
		if sc, err = c.scopes.find(owner, name); err != nil {
			return fail(0, err)
		}
		if closing && sc == nil {
			return fail(0, ErrClosed) // only a nested acquisition goes on while closing
		}
	}
	// Fast path: one attempt, unless another caller of this process is already
	// waiting for the name (then the attempt would only fail) or fair mode
	// (where the first attempt must also queue).
	if !wait || sc != nil || (!cfg.fair && (reentrant || !c.waiting(ks[0]))) {
		lk, pttl, err := a.once(ctx, ctx)
		if lk != nil || err != nil {
			return lk, err
		}
		if sc != nil && c.scopes.current(sc) {
			// Another owner holds what this owner's scope should hold.
			c.scopes.lose(sc, ErrLost)
			return fail(0, ErrLost)
		}
		if !wait {
			return fail(pttl, nil)
		}
	}

	return a.wait(ctx)
}

// acquisition is one Lock or TryLock call of a Client.
type acquisition struct {
	c      *Client
	name   string
	cfg    *config
	start  time.Time
	ks     []string // the lock's keys (see keys)
	kv     []any    // ks, boxed
	owner  string   // WithOwner's id, or a fresh one
	ov     any      // owner, boxed
	acq    any      // the acquisition id (the owner itself when fresh)
	scoped bool     // under WithOwner
}

// fail ends the call without the lock: the error (a *NotObtainedError) and
// its event.
func (a *acquisition) fail(ctx context.Context, pttl time.Duration, err error) (*Lock, error) {
	e := &NotObtainedError{Name: a.name, RetryAfter: pttl, Waited: time.Since(a.start), Err: err}
	a.cfg.emit(ctx, Event{Kind: EventNotObtained, Name: a.name, Wait: e.Waited, Err: err})
	return nil, e
}

// granted makes the caller's Lock of a grant g (see Client.granted).
func (a *acquisition) granted(ctx context.Context, res attemptResult, g grant) (*Lock, error) {
	lk, err := a.c.granted(ctx, a.scoped, a.name, a.ks, a.kv, a.ov, a.acq, res, a.cfg, g, a.start)
	if err != nil {
		return a.fail(ctx, 0, err)
	}
	return lk, nil
}

// once makes one attempt without queueing, under actx: a grant, a refusal
// (no Lock, no error, the holder's lease left), or a failure.
func (a *acquisition) once(ctx, actx context.Context) (lk *Lock, pttl time.Duration, err error) {
	c := a.c
	sent := time.Now()
	res, err := c.attempt(actx, a.ks, a.kv, a.ov, a.acq, a.cfg, "")
	switch {
	case err != nil:
		c.reload(actx)
		if c.mayHaveRun(err) {
			// The script may have run although its reply never came.
			c.giveBack(actx, a.kv, a.ov, a.acq, a.cfg, "", true)
		}
		_, err = a.fail(ctx, 0, err)
		return nil, 0, err
	case res.ok:
		lk, err := a.granted(ctx, res, grant{Sent: sent, Lease: a.cfg.lease})
		return lk, 0, err
	}
	return nil, res.pttl, nil
}

// wait waits for the lock, within the wait budget and ctx: at the
// process's gate for the name (default mode), then in the lock's queue in
// Redis, woken by a hand-off or a timer.
func (a *acquisition) wait(ctx context.Context) (*Lock, error) {
	c, cfg, ks, kv, ov, acq, owner := a.c, a.cfg, a.ks, a.kv, a.ov, a.acq, a.owner
	fail := func(pttl time.Duration, err error) (*Lock, error) { return a.fail(ctx, pttl, err) }
	granted := func(res attemptResult, g grant) (*Lock, error) { return a.granted(ctx, res, g) }
	wctx, cancel := context.WithTimeout(ctx, cfg.wait-time.Since(a.start))
	defer cancel()
	wctx, stop := c.life.waitFor(wctx) // Close and Shutdown end the wait
	defer stop()
	// Listening (the gate subscribed) before taking a turn at the gate: a
	// caller queued in Redis by the Unlock that passes it the turn (see gate)
	// may be handed the lock before it could listen otherwise.
	g, err := c.openGate(wctx, ks[0])
	if err != nil {
		if wctx.Err() != nil || c.life.closed.Load() {
			return fail(0, c.life.cause(ctx))
		}
		return fail(0, err)
	}
	defer c.ungate(ks[0], g)
	acqs := acq.(string)
	handed := g.listen(acqs)
	defer g.unlisten(acqs)

	member := owner + "|" + cfg.leaseV.(string) + "|" + c.id + "|" + acqs // as acquire.lua builds it
	// giveBack withdraws this wait from the lock's queue, and gives back a
	// hand-off made to it, when it ends without the lock.
	giveBack := func() { c.giveBack(c.life.backCtx(ctx, wctx), kv, ov, acq, cfg, member, false) }
	var pre turnOutcome // what the previous turn's holder did for this caller
	var keeper *turnKeeper
	if !cfg.fair {
		c.ref(g) // the turn's, kept by a grant or passed on
		w := &gateWaiter{member: member, turn: make(chan turnOutcome, 1), back: c.giveBackCall(kv, ov, acq, cfg, member)}
		if a.scoped {
			w.owner = owner
		}
		for {
			o, owned, err := g.enter(wctx, w)
			if o.reenter && err == nil {
				// This owner was granted the lock while w waited: re-enter.
				lk, _, err := a.once(ctx, wctx)
				if lk != nil || err != nil {
					c.ungate(ks[0], g) // the turn's reference: w has no turn
					return lk, err
				}
				continue // the holding ended meanwhile: wait again
			}
			if !owned {
				c.ungate(ks[0], g)
				return fail(0, c.life.cause(ctx))
			}
			keeper = &turnKeeper{c: c, key: ks[0], g: g}
			defer func() {
				if keeper != nil { // not kept by a grant
					keeper.pass(nil, turnOutcome{})
				}
			}()
			if err != nil {
				if o.queued || o.granted || o.unknown {
					giveBack()
				}
				return fail(0, c.life.cause(ctx))
			}
			pre = o
			break
		}
	}
	grantedKeep := func(res attemptResult, gr grant) (*Lock, error) {
		lk, err := granted(res, gr)
		if err == nil && keeper != nil {
			lk.h.keepTurn(keeper)
			keeper = nil
		}
		return lk, err
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var pttl time.Duration
	queued := pre.queued // queued by the previous turn's holder: no attempt needed to wait
	// A hand-off comes with a short claim lease, set by a release that ran
	// after this caller's last command that found it not holding (sent at
	// notBefore; see grant). The renewer restores the full lease at its
	// first turn (a fixed lease, or one that replicas must acknowledge, is
	// set at once).
	claim := min(cfg.lease, placeTTL)
	notBefore := pre.sent
	for {
		var fence uint64
		var fenceV any
		if pre.granted {
			fence, fenceV = pre.fence, pre.fenceV
			pre.granted = false
		} else {
			var d time.Duration
			if queued {
				queued = false
				d = placeTTL / 2 // the holder's lease is not known: refresh the place in time
			} else {
				select {
				case <-handed: // a hand-off this attempt will see for itself
				default:
				}
				sent := time.Now()
				res, err := c.attempt(wctx, ks, kv, ov, acq, cfg, member)
				if err != nil {
					c.reload(ctx)
					giveBack()
					if wctx.Err() != nil {
						return fail(pttl, c.life.cause(ctx))
					}
					return fail(pttl, err)
				}
				if res.ok {
					return grantedKeep(res, grant{Sent: sent, Lease: cfg.lease})
				}
				notBefore, pttl = sent, res.pttl
				// Sleep until a wake-up, or a little past the holder's lease (it may
				// expire without a release), or until the queue place needs refreshing.
				d = min(pttl+time.Millisecond, placeTTL/2)
			}
			d = max(d-time.Duration(rand.Int64N(int64(d)/5+1)), time.Millisecond)
			timer.Reset(d)
			f, ok, done := await(wctx, handed, timer)
			if done {
				giveBack() // a hand-off may have come meanwhile
				return fail(pttl, c.life.cause(ctx))
			}
			if !ok {
				continue
			}
			fence = f
		}
		gr := grant{Sent: notBefore, Lease: claim}
		switch {
		case cfg.replicas > 0:
			sent := time.Now()
			if err := c.handedWait(wctx, kv, ov, acq, cfg); err != nil {
				return fail(0, err)
			}
			gr = grant{Sent: sent, Lease: cfg.lease}
		case !cfg.renew && claim < cfg.lease, gr.Due():
			// A fixed lease is set at once; and a hand-off whose renewal is
			// due already (its release ran at some point after notBefore,
			// which this caller slept past a third of the claim) is
			// confirmed before it is handed over: the caller gets the full
			// lease from now, not a Lock spent or about to be lost.
			sent := time.Now()
			if err := c.extendKey(wctx, kv, ov, acq, cfg.lease, 1); refusal(err) {
				continue // the claim ran out before the lease was set: the hand-off is gone
			} else if err != nil {
				giveBack()
				if wctx.Err() != nil {
					return fail(pttl, c.life.cause(ctx))
				}
				return fail(0, err)
			}
			gr = grant{Sent: sent, Lease: cfg.lease}
		}
		return grantedKeep(attemptResult{ok: true, fence: fence, fenceV: fenceV}, gr)
	}
}

// await sleeps until the lock is handed to the waiter (its fence, from the
// gate's hand-off channel), the timer fires, or wctx ends (done).
func await(wctx context.Context, handed <-chan uint64, timer *time.Timer) (fence uint64, ok, done bool) {
	select {
	case fence = <-handed:
		return fence, true, false
	case <-timer.C:
		return 0, false, false
	case <-wctx.Done():
		return 0, false, true
	}
}

// mayHaveRun reports whether a command that failed with err may still have
// run on the server (see rcmd.Runner.MayHaveRun): not when the breaker
// refused it.
func (c *Client) mayHaveRun(err error) bool {
	return !errors.Is(err, ErrCircuitOpen) && c.run.MayHaveRun(err)
}

// granted makes the Lock of a grant g (see grant). A grant to an owner (WithOwner) joins the owner's scope of the
// name; when that scope's holding turns out to be gone, the grant is given
// back and granted fails with ErrLost.
func (c *Client) granted(ctx context.Context, scoped bool, name string, ks []string, kv []any, owner, acq any, res attemptResult, cfg *config, g grant, start time.Time) (*Lock, error) {
	giveBack := func(err error) (*Lock, error) {
		c.giveBack(ctx, kv, owner, acq, cfg, "", false)
		return nil, err
	}
	if g.Spent() {
		return giveBack(ErrNoValidity)
	}
	h := newHeld(c, name, ks, owner.(string), res.fence, cfg, g)
	h.keyv, h.ownerv, h.acqv, h.fenceV = kv, owner, acq, res.fenceV
	if c.life.closed.Load() && !(scoped && c.scopes.held(h.owner, name)) {
		return giveBack(ErrClosed) // closing: only a nested acquisition goes on
	}
	if scoped {
		if err := c.scopes.join(h, h.owner, res.reentered); err != nil {
			return giveBack(err)
		}
	}
	if !c.ren.add(h) {
		if h.sc != nil {
			h.sc.leave(h)
		}
		return giveBack(ErrClosed)
	}
	kind := EventAcquired
	if res.reentered {
		kind = EventReentered
	}
	if scoped {
		c.ownerGranted(ks[0], h.owner) // its callers waiting at the gate re-enter
	}
	cfg.emit(ctx, Event{Kind: kind, Name: name, Wait: time.Since(start), Fence: h.publicFence()})
	return &Lock{h: h, parent: ctx}, nil
}

// ownerGranted makes this process's callers of owner waiting at the gate of
// the lock key re-enter the holding just granted to owner, instead of
// waiting for it to end.
func (c *Client) ownerGranted(key, owner string) {
	c.mu.Lock()
	g := c.gates[key]
	c.mu.Unlock()
	if g != nil {
		g.ownerGranted(owner)
	}
}

// testHookClaimed runs after a release claimed the next waiter at the gate
// (tests only).
var testHookClaimed func()

// release gives back h's hold. When h keeps its process's gate turn, the
// next caller waiting at the gate is queued in Redis by the same script (or
// handed the lock, when nobody else waits) and then given the turn with that
// outcome: its wait costs no request of its own.
func (c *Client) release(ctx context.Context, h *held) (int64, error) {
	t := h.takeTurn()
	var next *gateWaiter
	var nextV any = ""
	if t != nil {
		if next = t.g.claim(); next != nil {
			nextV = next.member
			if testHookClaimed != nil {
				testHookClaimed()
			}
		}
	}
	o := turnOutcome{sent: time.Now()}
	call := releaseS.call(h.keyv, []any{h.ownerv, h.acqv, "", h.cfg.argsReleaseV, c.pubV, h.fenceArg(), nextV})
	var reply any
	var err error
	if c.life.closed.Load() {
		// Closing began: a queued call's sender may be cancelled by Close
		// before it sends (batcher.close), and an Unlock of a holding Close
		// dropped must still give its key back (see Lock.Unlock).
		reply, err = c.b.direct(ctx, call).Result()
	} else {
		reply, err = c.b.do(ctx, call, nil).Result()
	}
	n := int64(0)
	switch v := reply.(type) {
	case int64:
		n = v
		o.queued = next != nil && n >= 0
		if v == -3 { // released (the lease had run out unnoticed), the next waiter not queued
			n = 0
		}
	case string: // the last hold, handed to next with this fence
		f, perr := strconv.ParseUint(v, 10, 64)
		if perr != nil {
			err = fmt.Errorf("locks: unexpected release reply %q", v)
		}
		o.granted, o.fence, o.fenceV = true, f, reply
	}
	if err != nil {
		o = turnOutcome{unknown: next != nil}
		// The release may not have reached Redis (stalled, the breaker
		// open): send it again until it does (see batcher.later), so that
		// Redis answering again frees the lock, also from a renewal or
		// Extend of the hold that Redis runs when it resumes. (Without the
		// next waiter: it gets the turn with an unknown outcome and finds
		// out for itself.)
		c.b.later(releaseS.call(h.keyv, []any{h.ownerv, h.acqv, "", h.cfg.argsReleaseV, c.pubV, h.fenceArg()}))
	}
	if t != nil {
		t.pass(next, o)
	}
	return n, err
}

// abandon gives h's hold back at once, expired or not: a Client hold's local
// deadline is the earliest moment Redis may expire it (see grant).
func (c *Client) abandon(h *held, _ bool) {
	c.b.later(releaseS.call(h.keyv, []any{h.ownerv, h.acqv, "", h.cfg.argsReleaseV, c.pubV, h.fenceArg()}))
}

func (c *Client) extend(ctx context.Context, h *held, lease time.Duration) error {
	h.mu.Lock()
	seq := h.seq
	h.mu.Unlock()
	return c.extendKey(ctx, h.keyv, h.ownerv, h.acqv, lease, seq)
}

// extendKey sets the lease of the lock (keys kv) held by owner, for its hold
// acq's command number seq (see extend.lua and extended).
func (c *Client) extendKey(ctx context.Context, kv []any, owner, acq any, lease time.Duration, seq int64) error {
	return extended(extendS.runVia(ctx, c.b, nil, kv[:1], owner, lease.Milliseconds(), acq, seq).Int64())
}

// extended is the outcome of extend.lua's reply n (err: the command's):
// nil when the lock keeps the lease, errOvertaken, errHoldGone (the owner
// holds the lock without this hold), errNotOwner.
func extended(n int64, err error) error {
	switch {
	case err != nil:
		return err
	case n == 1:
		return nil
	case n == 2:
		return errOvertaken
	case n == 3:
		return errHoldGone
	}
	return errNotOwner
}

// renewBatch extends every lock in hs: one pipeline per master node, the
// nodes in parallel, each reporting its locks' outcomes as soon as it
// answered, so a dead or slow node delays only its own locks' renewals, never
// the others'.
func (c *Client) renewBatch(ctx context.Context, hs []*held, report func(*held, error)) {
	groups := map[string][]*held{} // by master address
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		for _, h := range hs {
			addr := "?"
			if node, err := cc.MasterForKey(ctx, h.keys[0]); err == nil {
				addr = node.Options().Addr
			}
			groups[addr] = append(groups[addr], h)
		}
	} else {
		groups[""] = hs
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { c.renewGroup(ctx, g, report) })
	}
	wg.Wait()
}

func (c *Client) renewGroup(ctx context.Context, hs []*held, report func(*held, error)) {
	var first time.Time // the earliest local deadline
	cmds := make([]*redis.Cmd, len(hs))
	args := make([][3]any, len(hs))
	for i, h := range hs {
		h.mu.Lock()
		if first.IsZero() || h.deadline.Before(first) {
			first = h.deadline
		}
		args[i] = [3]any{h.wireLease.Milliseconds(), h.acqv, h.seq} // see takeWire
		h.mu.Unlock()
	}
	// A renewal is bounded by the command timeout (the runner's) and by the
	// earliest local deadline, past which its reply could not save the lock:
	// on a link slower than a third of the lease, renewals that Redis
	// answers still arrive in time. The bound reaches the socket only with
	// ContextTimeoutEnabled; without it the renewer's deadlines still end
	// the locks on time.
	ctx, cancel := context.WithDeadline(ctx, maxTime(first, time.Now().Add(10*time.Millisecond)))
	defer cancel()
	for i, h := range hs {
		cmds[i] = extendS.cmd(ctx, h.keyv[:1], h.ownerv, args[i][0], args[i][1], args[i][2])
	}
	exec(ctx, c.run, nil, cmds, 0, false)
	failed := false
	for i, cmd := range cmds {
		if cmd.Err() != nil {
			failed = true
		}
		report(hs[i], extended(cmd.Int64()))
	}
	if failed {
		c.reload(ctx)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// reload refreshes a cluster client's slot map after a failure. go-redis
// otherwise keeps dialling a killed master until its periodic reload (60s by
// default; redis/go-redis#3979), which would outlast every lease.
func (c *Client) reload(ctx context.Context) {
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		cc.ReloadState(ctx)
	}
}
