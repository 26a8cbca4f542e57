package systems

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-redis/cache/v9"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/singleflight"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// Cache-aside systems. The names are the labels of RESULTS.md.
const (
	Naive            = "naive cache-aside"
	Singleflight     = "per-process singleflight"
	SingleflightLoad = "per-process singleflight (load only)"
	GoRedisCache     = "go-redis/cache Once"
	GoRedisGet       = "go-redis/cache Get"
	GoRedisLocal     = "go-redis/cache Once + local TinyLFU"
	LockRedsync      = "lock+double-check (redsync)"
	LockBSM          = "lock+double-check (bsm/redislock)"
	LockRueidis      = "lock+double-check (rueidislock)"
	Guard            = "cacheguard (wait)"
	GuardStale       = "cacheguard (serve-stale, expired key)"
	GuardSWR         = "cacheguard (serve-stale)"
	// GuardHandOff is cacheguard (wait) on a client without
	// ContextTimeoutEnabled, on which a hit hands its read to a goroutine of
	// the Guard's (the others use the client cacheguard's README recommends).
	GuardHandOff = "cacheguard (wait, client without ContextTimeoutEnabled)"
	// GuardTimeouts is cacheguard (wait) on a client without
	// ContextTimeoutEnabled whose ReadTimeout and WriteTimeout (400 ms each)
	// fit within the command timeout's bound: a hit reads on its caller's
	// goroutine.
	GuardTimeouts = "cacheguard (wait, client without ContextTimeoutEnabled, Read/WriteTimeout 400 ms)"
	// GuardMsgPack is cacheguard (wait) with its opt-in MsgPack codec, the
	// codec go-redis/cache uses.
	GuardMsgPack = "cacheguard (wait, MsgPack codec)"
	// GuardNear is cacheguard (wait) with its in-process near cache: up to
	// 10,000 values per process, kept at most one TTL.
	GuardNear      = "cacheguard (near cache)"
	RawGetDecode   = "raw GET + decode"
	defaultTTLCopy = time.Minute
	// MaxLoadsEnv, when set to n > 0 in a worker's environment (cgbench
	// -maxloads n sets it for its workers), gives every cacheguard system
	// MaxConcurrentLoads(n).
	MaxLoadsEnv = "CGBENCH_MAXLOADS"
	// staleWindow is how long past its TTL the serve-stale systems serve a value.
	staleWindow = 10 * time.Minute
)

// Repo is the cached value: a small record, about 300 bytes as JSON.
type Repo struct {
	ID          int64    `json:"id" msgpack:"id"`
	Owner       string   `json:"owner" msgpack:"owner"`
	Name        string   `json:"name" msgpack:"name"`
	Description string   `json:"description" msgpack:"description"`
	Stars       int      `json:"stars" msgpack:"stars"`
	Forks       int      `json:"forks" msgpack:"forks"`
	Topics      []string `json:"topics" msgpack:"topics"`
	UpdatedAt   int64    `json:"updated_at" msgpack:"updated_at"`
}

// SampleRepo is the value every loader returns.
func SampleRepo(id int64) Repo {
	return Repo{
		ID: id, Owner: "cacheguard", Name: "cacheguard",
		Description: "Redis locks and a cache-stampede guard that stay correct under crashes, pauses and failover.",
		Stars:       4242, Forks: 137, Topics: []string{"redis", "cache", "lock", "go", "stampede"},
		UpdatedAt: 1_700_000_000,
	}
}

// Loader loads the value from the database.
type Loader func(ctx context.Context) (Repo, error)

// CacheConfig configures a cache system.
type CacheConfig struct {
	Addr string
	// TTL is how long a value stays fresh; 1 minute when zero.
	TTL time.Duration
	// Retry is the polling delay of the lock-based systems; 50ms when zero.
	Retry time.Duration
	// Counter counts the commands sent (may be nil).
	Counter *Counter
	// Marks, when set, records when cacheguard's flights received a value
	// another process loaded (the stampede timeline); other systems ignore it.
	Marks *Marks
	// Trace, when set, records what a cacheguard system did (see Trace);
	// other systems ignore it.
	Trace *Trace
	// Dropped, when set, is told each key cacheguard's near cache dropped on
	// another process's message (EventNearInvalidated); other systems
	// ignore it.
	Dropped func(key string)
}

// Marks records when a point of a cold-key fill was first reached in this
// process (unix ns; 0 when never).
type Marks struct {
	// Remote: a flight of this process got the value another process loaded,
	// from its push, decoded (cacheguard's EventCoalescedRemote).
	Remote atomic.Int64
}

// guardOptions are the options every cacheguard system shares.
func guardOptions(cfg CacheConfig, more ...cacheguard.Option) []cacheguard.Option {
	opts := append([]cacheguard.Option{cacheguard.TTL(cfg.TTL)}, more...)
	if n, err := strconv.Atoi(os.Getenv(MaxLoadsEnv)); err == nil && n > 0 {
		opts = append(opts, cacheguard.MaxConcurrentLoads(n))
	}
	if m, t, d := cfg.Marks, cfg.Trace, cfg.Dropped; m != nil || t != nil || d != nil {
		opts = append(opts, cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
			if m != nil && e.Kind == cacheguard.EventCoalescedRemote {
				m.Remote.CompareAndSwap(0, time.Now().UnixNano())
			}
			if d != nil && e.Kind == cacheguard.EventNearInvalidated {
				d(e.Key)
			}
			if t != nil {
				t.observe(e)
			}
		}))
	}
	return opts
}

// Cache is one cache-aside implementation.
type Cache interface {
	// Get returns the cached value of key, loading and storing it on a miss.
	Get(ctx context.Context, key string, load Loader) (Repo, error)
	Close() error
}

// StalePrimer is implemented by systems that can serve an expired value:
// PrimeStale stores v under key so that it is past its TTL but servable.
type StalePrimer interface {
	PrimeStale(ctx context.Context, key string, v Repo) error
}

// NewCache returns the named cache system.
func NewCache(name string, cfg CacheConfig) (Cache, error) {
	if cfg.TTL == 0 {
		cfg.TTL = defaultTTLCopy
	}
	if cfg.Retry == 0 {
		cfg.Retry = 50 * time.Millisecond
	}
	switch name {
	case Naive, RawGetDecode:
		return &naive{rdb: NewRedis(cfg.Addr, cfg.Counter), ttl: cfg.TTL}, nil
	case Singleflight:
		return &flight{naive: naive{rdb: NewRedis(cfg.Addr, cfg.Counter), ttl: cfg.TTL}}, nil
	case SingleflightLoad:
		return &loadFlight{naive: naive{rdb: NewRedis(cfg.Addr, cfg.Counter), ttl: cfg.TTL}}, nil
	case GoRedisCache, GoRedisGet:
		rdb := NewRedis(cfg.Addr, cfg.Counter)
		return &goRedisCache{rdb: rdb, c: cache.New(&cache.Options{Redis: rdb}), ttl: cfg.TTL, once: name == GoRedisCache}, nil
	case GoRedisLocal:
		// The local tier as go-redis/cache's README sets it up (1000 keys),
		// its entries living as long as the Redis ones (the TTL, plus up to
		// 10% of random extra that TinyLFU adds): a value can be served up to
		// about twice the TTL after it was loaded.
		rdb := NewRedis(cfg.Addr, cfg.Counter)
		lc := cache.NewTinyLFU(1000, cfg.TTL)
		return &goRedisCache{rdb: rdb, c: cache.New(&cache.Options{Redis: rdb, LocalCache: lc}), ttl: cfg.TTL, once: true}, nil
	case LockRedsync, LockBSM, LockRueidis:
		mu := map[string]string{LockRedsync: Redsync, LockBSM: BSM, LockRueidis: Rueidislock}[name]
		m, err := NewMutex(mu, MutexConfig{Addrs: []string{cfg.Addr}, Retry: cfg.Retry, Counter: cfg.Counter})
		if err != nil {
			return nil, err
		}
		return &lockCheck{naive: naive{rdb: NewRedis(cfg.Addr, cfg.Counter), ttl: cfg.TTL}, mu: m}, nil
	case Guard:
		rdb := newGuardRedis(cfg.Addr, cfg.Counter, cfg.Trace)
		return &guard{rdb: rdb, g: cacheguard.New(rdb, guardOptions(cfg)...)}, nil
	case GuardHandOff:
		rdb := NewRedis(cfg.Addr, cfg.Counter)
		return &guard{rdb: rdb, g: cacheguard.New(rdb, guardOptions(cfg)...)}, nil
	case GuardTimeouts:
		rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr, ReadTimeout: 400 * time.Millisecond, WriteTimeout: 400 * time.Millisecond})
		if cfg.Counter != nil {
			rdb.AddHook(hook{cfg.Counter})
		}
		return &guard{rdb: rdb, g: cacheguard.New(rdb, guardOptions(cfg)...)}, nil
	case GuardMsgPack:
		rdb := newGuardRedis(cfg.Addr, cfg.Counter, cfg.Trace)
		return &guard{rdb: rdb, g: cacheguard.New(rdb, guardOptions(cfg, cacheguard.Encoding(cacheguard.MsgPack{}))...)}, nil
	case GuardNear:
		rdb := newGuardRedis(cfg.Addr, cfg.Counter, cfg.Trace)
		return &guard{rdb: rdb, g: cacheguard.New(rdb, guardOptions(cfg, cacheguard.NearCache(10000, cfg.TTL))...)}, nil
	case GuardStale, GuardSWR:
		rdb := newGuardRedis(cfg.Addr, cfg.Counter, cfg.Trace)
		return &guard{rdb: rdb, g: cacheguard.New(rdb, guardOptions(cfg, cacheguard.ServeStale(staleWindow))...)}, nil
	}
	return nil, fmt.Errorf("systems: unknown cache %q", name)
}

// --- naive: GET, and on a miss load and SET

type naive struct {
	rdb *redis.Client
	ttl time.Duration
}

func (n *naive) lookup(ctx context.Context, key string) (Repo, bool, error) {
	b, err := n.rdb.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return Repo{}, false, nil
	}
	if err != nil {
		return Repo{}, false, err
	}
	var v Repo
	if err := json.Unmarshal(b, &v); err != nil {
		return Repo{}, false, err
	}
	return v, true, nil
}

func (n *naive) fill(ctx context.Context, key string, load Loader) (Repo, error) {
	v, err := load(ctx)
	if err != nil {
		return Repo{}, err
	}
	b, err := json.Marshal(v)
	if err != nil {
		return Repo{}, err
	}
	return v, n.rdb.Set(ctx, key, b, n.ttl).Err()
}

func (n *naive) Get(ctx context.Context, key string, load Loader) (Repo, error) {
	v, ok, err := n.lookup(ctx, key)
	if ok || err != nil {
		return v, err
	}
	return n.fill(ctx, key, load)
}

func (n *naive) Close() error { return n.rdb.Close() }

// --- per-process singleflight around the naive read

type flight struct {
	naive
	g singleflight.Group
}

func (f *flight) Get(ctx context.Context, key string, load Loader) (Repo, error) {
	v, err, _ := f.g.Do(key, func() (any, error) { return f.naive.Get(ctx, key, load) })
	if err != nil {
		return Repo{}, err
	}
	return v.(Repo), nil
}

// --- per-process singleflight around the load only: every request sends its
// own GET, and a miss joins the process's load (the pattern the stampede
// issue measured: "whose 1024 separate GETs cost more than a coalesced fill")

type loadFlight struct {
	naive
	g singleflight.Group
}

func (f *loadFlight) Get(ctx context.Context, key string, load Loader) (Repo, error) {
	if v, ok, err := f.naive.lookup(ctx, key); err != nil || ok {
		return v, err
	}
	v, err, _ := f.g.Do(key, func() (any, error) { return f.naive.fill(ctx, key, load) })
	if err != nil {
		return Repo{}, err
	}
	return v.(Repo), nil
}

// --- go-redis/cache (msgpack codec, with or without its local tier)

type goRedisCache struct {
	rdb  *redis.Client
	c    *cache.Cache
	ttl  time.Duration
	once bool
}

func (g *goRedisCache) Get(ctx context.Context, key string, load Loader) (Repo, error) {
	var v Repo
	if !g.once {
		err := g.c.Get(ctx, key, &v)
		if err == nil || !errors.Is(err, cache.ErrCacheMiss) {
			return v, err
		}
	}
	err := g.c.Once(&cache.Item{Ctx: ctx, Key: key, Value: &v, TTL: g.ttl, Do: func(*cache.Item) (any, error) {
		return load(ctx)
	}})
	return v, err
}

func (g *goRedisCache) Close() error { return g.rdb.Close() }

// --- lock, then check the cache again, then load

type lockCheck struct {
	naive
	mu Mutex
}

func (l *lockCheck) Get(ctx context.Context, key string, load Loader) (Repo, error) {
	if v, ok, err := l.lookup(ctx, key); ok || err != nil {
		return v, err
	}
	h, err := l.mu.Acquire(ctx, "fill:"+key)
	if err != nil {
		return Repo{}, err
	}
	defer h.Release(context.WithoutCancel(ctx))
	if v, ok, err := l.lookup(ctx, key); ok || err != nil {
		return v, err
	}
	return l.fill(ctx, key, load)
}

func (l *lockCheck) Close() error { return errors.Join(l.mu.Close(), l.naive.Close()) }

// --- cacheguard

// newGuardRedis is the client cacheguard's README asks for: go-redis bounds
// its socket calls by the context's deadline (ContextTimeoutEnabled), so a
// Get reads on its own goroutine and still keeps its wait budget.
func newGuardRedis(addr string, c *Counter, t *Trace) *redis.Client {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	if c != nil {
		rdb.AddHook(hook{c})
	}
	if t != nil {
		rdb.AddHook(traceHook{t})
	}
	return rdb
}

type guard struct {
	rdb *redis.Client
	g   *cacheguard.Guard
}

func (g *guard) Get(ctx context.Context, key string, load Loader) (Repo, error) {
	return cacheguard.Get(ctx, g.g, key, load)
}

// PrimeStale stores v with a 1 ms TTL (no jitter, no early refresh) and a
// stale window, then lets it expire. Nothing reads it before the run: a read
// of the stale value would start the refresh.
func (g *guard) PrimeStale(ctx context.Context, key string, v Repo) error {
	const ttl = time.Millisecond
	_, err := cacheguard.Get(ctx, g.g, key, func(context.Context) (Repo, error) { return v, nil },
		cacheguard.TTL(ttl), cacheguard.Jitter(0), cacheguard.EarlyRefresh(0), cacheguard.ServeStale(staleWindow))
	if err != nil {
		return err
	}
	time.Sleep(20 * ttl)
	return nil
}

func (g *guard) Close() error { return errors.Join(g.g.Close(), g.rdb.Close()) }

// Invalidate voids key in every process (cacheguard's Invalidate).
func (g *guard) Invalidate(ctx context.Context, key string) error { return g.g.Invalidate(ctx, key) }

// NearHits returns the hits the near cache served so far.
func (g *guard) NearHits() uint64 { return g.g.Stats().NearHits }

// Invalidator is implemented by the systems that void a key across
// processes.
type Invalidator interface {
	Invalidate(ctx context.Context, key string) error
}

// NearCounter is implemented by the systems with a near cache.
type NearCounter interface {
	NearHits() uint64
}
