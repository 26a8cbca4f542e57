package cacheguard

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/cacheguard/cacheguard/internal/wake"
)

// Guard is the cache: one per process and Redis deployment (a single server, a
// Sentinel-managed master or a Redis Cluster), shared by every Get. It is safe
// for concurrent use. Close stops its background work.
type Guard struct {
	rdb redis.UniversalClient
	cfg config
	hub *wake.Hub // the shared subscription for fill wake-ups
	pub string    // PUBLISH, or SPUBLISH on a cluster
	sem chan struct{}

	reads   reads              // per value key: one GET in flight per process
	flights singleflight.Group // per value key: one flight to Redis per process
	noLease singleflight.Group // per value key: loads without the lease after a wait timeout
	stats   counters
	callIDs atomic.Uint64

	mu         sync.Mutex                    // guards tasks, refreshing, nextTask, closed
	tasks      map[uint64]context.CancelFunc // running flights and refreshes, cancelled by Close
	refreshing map[string]time.Time          // value keys not to refresh now: a refresh runs (zero time) or another process's fill holds the lease until then
	nextTask   uint64
	closed     bool
	wg         sync.WaitGroup // the tasks
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
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		panic(err.Error())
	}
	if cfg.report != nil {
		panic(invalid("ReportTo is a per-call option").Error())
	}
	g := &Guard{
		rdb: rdb, cfg: cfg, hub: wake.New(rdb), pub: "PUBLISH",
		tasks: map[uint64]context.CancelFunc{}, refreshing: map[string]time.Time{},
	}
	if g.hub.Sharded() {
		g.pub = "SPUBLISH"
	}
	if cfg.maxLoads > 0 {
		g.sem = make(chan struct{}, cfg.maxLoads)
	}
	return g
}

// Close stops every background refresh, renewal and load the Guard started
// (their contexts are cancelled; a load that ignores its context is waited
// for) and the shared subscription. Calls still waiting get ErrClosed; later
// calls fail with ErrClosed. Close does not close rdb. It is safe to call more
// than once.
func (g *Guard) Close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil
	}
	g.closed = true
	cancels := make([]context.CancelFunc, 0, len(g.tasks))
	for _, c := range g.tasks {
		cancels = append(cancels, c)
	}
	g.mu.Unlock()
	for _, c := range cancels {
		c()
	}
	g.wg.Wait()
	g.hub.Close()
	return nil
}

// Stats returns the Guard's counters.
func (g *Guard) Stats() Stats {
	if g == nil {
		return Stats{}
	}
	return g.stats.snapshot()
}

// Invalidate deletes the cached values of keys and voids every fill in flight
// for them: it deletes the fill leases too, so a load that started before the
// invalidation fails its compare-and-set and writes nothing (its callers still
// get what it loaded), and wakes the waiters, who take a new lease and load
// again. Calls of this process that start after Invalidate returns do not
// join a flight that started before it.
func (g *Guard) Invalidate(ctx context.Context, keys ...string) error {
	if g == nil {
		return invalid("nil Guard")
	}
	for _, k := range keys {
		if err := validKey(k); err != nil {
			return err
		}
	}
	if g.isClosed() {
		return ErrClosed
	}
	if len(keys) == 0 {
		return nil
	}
	pipe := g.rdb.Pipeline()
	for _, k := range keys {
		ks := g.keys(k)
		pipe.Del(ctx, ks.value, ks.lease)
		if g.hub.Sharded() {
			pipe.SPublish(ctx, ks.wake, "x")
		} else {
			pipe.Publish(ctx, ks.wake, "x")
		}
	}
	_, err := pipe.Exec(ctx)
	for _, k := range keys {
		vk := g.keys(k).value
		g.flights.Forget(vk)
		g.noLease.Forget(vk)
	}
	if err != nil {
		g.note(EventRedisError, keys[0], 0, err)
		return fmt.Errorf("cacheguard: invalidate: %w", err)
	}
	return nil
}

func (g *Guard) isClosed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// callConfig checks a call's arguments and returns its configuration.
func (g *Guard) callConfig(key string, hasLoad bool, opts []Option) (config, error) {
	if g == nil {
		return config{}, invalid("nil Guard")
	}
	if err := validKey(key); err != nil {
		return config{}, err
	}
	if !hasLoad {
		return config{}, invalid("nil loader")
	}
	if g.isClosed() {
		return config{}, ErrClosed
	}
	if len(opts) == 0 {
		return g.cfg, nil
	}
	cfg := new(config) // options see a pointer: it escapes, so only calls with options pay for it
	*cfg = g.cfg
	cfg.guardOnly = false
	for _, o := range opts {
		o(cfg)
	}
	if cfg.guardOnly {
		return config{}, invalid("Prefix, MaxConcurrentLoads and WithObserver are Guard options (pass them to New)")
	}
	if err := cfg.validate(); err != nil {
		return config{}, err
	}
	return *cfg, nil
}

// track registers a task (a flight or a background refresh) that Close must
// cancel and wait for. It returns false after Close.
func (g *Guard) track(parent context.Context) (context.Context, func(), bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, nil, false
	}
	ctx, cancel := context.WithCancel(parent)
	id := g.nextTask
	g.nextTask++
	g.tasks[id] = cancel
	g.wg.Add(1)
	return ctx, func() {
		g.mu.Lock()
		delete(g.tasks, id)
		g.mu.Unlock()
		cancel()
		g.wg.Done()
	}, true
}

// keySet holds the Redis names of one cache key, under one hash tag so they
// share a slot: the envelope, the fill lease and the wake-up channel.
type keySet struct {
	value, lease, wake string
}

func (g *Guard) valueKey(key string) string { return g.cfg.prefix + "v:{" + key + "}" }

func (g *Guard) keys(key string) keySet {
	tag := "{" + key + "}"
	return keySet{value: g.cfg.prefix + "v:" + tag, lease: g.cfg.prefix + "fl:" + tag, wake: g.cfg.prefix + "fw:" + tag}
}

// token returns a random fill-lease token.
func token() string { return rand.Text() }
