package cacheguard

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/ratelog"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/rid"
	"github.com/cacheguard/cacheguard/internal/wake"
)

// Guard is the cache: one per process and Redis deployment (a single server, a
// Sentinel-managed master or a Redis Cluster), shared by every Get. It is safe
// for concurrent use. Close stops its background work.
type Guard struct {
	cmd *rcmd.Runner // every command and script goes through it
	cfg config
	hub *wake.Hub // the shared subscription for fill wake-ups
	pub string    // PUBLISH, or SPUBLISH on a cluster
	// origin names this Guard in the near-cache channel's messages, which
	// every Guard publishes on (ncChannel) whether it has a near cache or not.
	origin, ncChannel string
	near              *nearCache // nil unless NearCache
	log               *ratelog.Logger
	slots             *loadSlots // MaxConcurrentLoads' (nil: no bound)
	// ctxDeadlines: the client bounds its socket calls by the context's
	// deadline; else attempt bounds one attempt of a command on it (0: none).
	// Either lets a caller read on its own goroutine (see fetch).
	ctxDeadlines bool
	attempt      time.Duration
	starts       atomic.Pointer[startBy] // see inline
	jobs         sync.Pool               // of *readJob
	hits         hits                    // the reads of hits that share round trips
	typeNames    sync.Map                // reflect.Type → its name in Redis (see typeName)

	// The coalescer (see group), per entry: the reads of hits (a caller
	// shares a read sent after it arrived), the flights of misses (one to
	// Redis per process, see admit), and the loads run without the lease
	// (Redis unreachable, TimeoutLoad; a caller shares a load begun after it
	// arrived).
	reads    group[entry, stored]
	flights  flights
	unleased group[entry, *outcome]
	work     *workers
	stats    counters
	callIDs  atomic.Uint64

	// stop cancels every running flight and load (see track), with cause
	// ErrClosed, when Shutdown's ctx ends.
	root context.Context
	stop context.CancelCauseFunc

	mu     sync.Mutex     // orders closed's setting with track
	closed atomic.Bool    // set under mu, read without it by every call
	wg     sync.WaitGroup // the tasks
}

// New returns a Guard on rdb with the given defaults. It panics with a
// "cacheguard:" message when rdb is nil or an option is invalid (programmer
// error).
func New(rdb redis.UniversalClient, opts ...Option) *Guard {
	if rdb == nil {
		panic("cacheguard: New called with a nil redis client")
	}
	cfg := defaults()
	for _, o := range opts {
		if o == nil {
			panic("cacheguard: New called with a nil Option")
		}
		o.applyGuard(&cfg)
	}
	if err := cfg.validate(); err != nil {
		panic(err.Error())
	}
	g := &Guard{
		cmd: rcmd.New(rdb, cfg.cmdTime), cfg: cfg, hub: wake.New(rdb), pub: "PUBLISH", log: ratelog.New(cfg.logger, time.Second),
		work: &workers{jobs: make(chan job), quit: make(chan struct{})},
	}
	g.hits.cmd, g.hits.work, g.hits.direct = g.cmd, g.work, 2*runtime.GOMAXPROCS(0)
	g.root, g.stop = context.WithCancelCause(context.Background())
	if g.hub.Sharded() {
		g.pub = "SPUBLISH"
	}
	g.origin, g.ncChannel = rid.New()[:12], cfg.prefix+"nc"
	if cfg.nearSize > 0 {
		g.near = newNearCache(g, cfg.nearSize, cfg.nearTTL)
	}
	g.reads.limit = max(2, runtime.GOMAXPROCS(0))
	g.unleased.limit = 1
	g.ctxDeadlines, g.attempt = clientBounds(rdb)
	g.slots = newLoadSlots(cfg.maxLoads)
	return g
}

// Close is Shutdown without a grace period: it hands over at once every fill
// this Guard runs (so a waiter in another process takes it over without
// waiting for the lease to expire, and without an error) and stops its
// background work. Calls still waiting get ErrClosed; later calls fail with
// ErrClosed. Close does not close rdb. It is safe to call more than once.
func (g *Guard) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = g.Shutdown(ctx) // an ended context: the error says only that
	return nil
}

// Shutdown closes the Guard gracefully, as http.Server.Shutdown does a
// server: calls that begin afterwards fail with ErrClosed at once, while the
// work already running — loads (for callers of this process or in the
// background), waits for another process's fill — goes on until it ends or
// ctx does. A load that finishes in time is stored and pushed to the waiters
// of every process as usual. When ctx ends first, the rest is cancelled: a
// load that then fails hands its fill lease over (released with a message
// that makes a waiter in another process take the fill over at once — it sees
// one more load, never an error), its callers here and the calls still
// waiting get ErrClosed. A loader that ignores its context is waited for.
// Then the shared subscription stops. Shutdown returns ctx's error when it had
// to cancel work, else nil; a second call waits like the first.
func (g *Guard) Shutdown(ctx context.Context) error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	first := !g.closed.Swap(true)
	g.mu.Unlock()

	cancel := context.AfterFunc(ctx, func() { g.stop(ErrClosed) }) // when ctx ends first
	g.wg.Wait()
	var err error
	if !cancel() {
		err = ctx.Err()
	}
	g.unleased.close(&outcome{err: ErrClosed})
	g.reads.close(stored{err: ErrClosed})
	g.work.close()
	if first {
		g.hub.Close() // the near cache's watch with it
	}
	return err
}

// Stats returns the Guard's counters.
func (g *Guard) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	return g.stats.snapshot()
}

// Invalidate voids everything cached for keys, across every process: each
// key's generation moves forward in Redis, so at once every value stored
// under it — of every type and Variant, such as the responses ginmw.Cache
// keeps under a resource name — stops being served (its bytes stay until
// they are overwritten or expire), every fill in flight for it fails its
// compare-and-set and writes nothing (its callers still get what it loaded,
// as they began before the invalidation), and its waiters are woken to take
// a new lease and load again. A Get that begins after Invalidate returned, in
// any process, returns only a value loaded after it: a call takes only what
// it read, or what a fill whose store or release found the lease's
// generation current after the call began shares (see the package
// documentation); another
// process's near cache drops its values when the invalidation's message
// arrives, within a message's latency. When Redis
// cannot be reached it returns an error matching ErrUnavailable; when ctx
// ends first, ctx's error, and the invalidation may still land (it is not
// cut with ctx).
func (g *Guard) Invalidate(ctx context.Context, keys ...string) error {
	var values []string
	err := g.invalidate(ctx, "invalidate", keys, validKey, func(k string) redis.Cmder {
		n := g.names(k, "")
		values = append(values, n.values)
		return invalidateScript.Cmd(ctx, []any{n.gen, n.values}, n.wake, g.pub, genTTL.Milliseconds(), g.ncChannel, g.origin+" i"+k)
	}, func(ks []string) {
		for _, k := range ks {
			g.near.drop(k)
		}
	})
	for _, v := range values {
		g.flights.invalidated(v)
	}
	return err
}

// invalidate checks names (keys, or tags), then runs one script for each,
// made by cmd, in one pipeline. The near cache drops their values (with
// drop) before the scripts run, so that a read that begins now keeps nothing
// it finds, and after, so that neither does one that began before and found
// the old value; the other processes drop theirs on the scripts' message.
func (g *Guard) invalidate(ctx context.Context, what string, names []string, check func(string) error, cmd func(string) redis.Cmder, drop func([]string)) error {
	if g == nil {
		return invalid("nil Guard")
	}
	for _, n := range names {
		if err := check(n); err != nil {
			return err
		}
	}
	if g.closed.Load() {
		return ErrClosed
	}
	if len(names) == 0 {
		return nil
	}
	cmds := make([]redis.Cmder, len(names))
	for i, n := range names {
		cmds[i] = cmd(n)
	}
	send := func(ctx context.Context) {
		g.cmd.Exec(ctx, nil, cmds, 0, false)
		if g.near != nil {
			drop(names)
		}
	}
	if g.near != nil {
		drop(names)
	}
	if !g.ctxDeadlines || !g.cmd.Cuts(ctx, 0) {
		send(ctx)
	} else {
		// ctx would cut the scripts, and with them the connection: they run
		// detached from the caller, as a read does (see fetch), to the end,
		// bounded by the command timeout; the caller returns at its
		// deadline, not knowing whether they ran.
		done := make(chan struct{})
		g.work.run(funcJob(func() {
			send(context.WithoutCancel(ctx))
			close(done)
		}))
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("cacheguard: %s: %w", what, ctx.Err())
		}
	}
	var errs []error
	for i, c := range cmds {
		if err := c.Err(); err != nil && !errors.Is(err, redis.Nil) {
			errs = append(errs, fmt.Errorf("%q: %w", names[i], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return g.commandFailed(ctx, names[0], what, err)
	}
	return nil
}

// callConfig checks a call's Guard, loader and options, and returns its
// configuration: the Guard's own without options (nothing to copy).
func (g *Guard) callConfig(opts []CallOption, hasLoad bool) (*config, error) {
	if g == nil {
		return nil, invalid("nil Guard")
	}
	if !hasLoad {
		return nil, invalid("nil loader")
	}
	if g.closed.Load() {
		return nil, ErrClosed
	}
	if len(opts) == 0 {
		return &g.cfg, nil
	}
	cfg := new(config) // options see a pointer: it escapes, so only calls with options pay for it
	*cfg = g.cfg
	for _, o := range opts {
		if o == nil {
			return nil, invalid("nil CallOption")
		}
		o.applyCall(cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

// track registers a task (a flight, a load, a background refresh, a lease's
// renewals) that Close must cancel (with cause ErrClosed) and wait for. It
// returns false after Close — unless parent is a task's context: work that
// a running task starts (renewing the lease of a fill it took over, giving
// leases back, loading without the lease) is part of the work Shutdown lets
// run, and is waited for and cancelled with it.
func (g *Guard) track(parent context.Context) (context.Context, func(), bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed.Load() && parent.Value(taskKey{}) == nil {
		return nil, nil, false
	}
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, taskKey{}, true))
	unhook := context.AfterFunc(g.root, func() { cancel(context.Cause(g.root)) })
	g.wg.Add(1) // while closing, only beside a running task's: Shutdown's Wait allows it
	return ctx, func() {
		unhook()
		cancel(nil)
		g.wg.Done()
	}, true
}

// taskKey marks the context of a tracked task (see track).
type taskKey struct{}
