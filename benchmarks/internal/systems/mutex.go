// Package systems adapts cacheguard and every peer to the two shapes the
// harness drives: a distributed mutex and a cache-aside read.
package systems

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"

	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/locks"
)

// Mutex systems. The names are the labels of RESULTS.md.
const (
	Locks       = "cacheguard locks"
	LocksFair   = "cacheguard locks (fair)"
	Redsync     = "redsync"
	BSM         = "bsm/redislock"
	Rueidislock = "rueidislock"
	RawSetNX    = "raw SET NX PX + EVALSHA"
	// LocksScripts is a control: the command lines cacheguard's Lock and
	// Unlock send, replayed on the caller's goroutine with nothing else.
	LocksScripts = "cacheguard locks' own scripts, sent raw"
	Redlock      = "cacheguard Redlock"
)

// ErrNotMerged marks a system whose cacheguard code is not on this branch yet.
var ErrNotMerged = errors.New("systems: not merged into the benchmark branch yet")

// MutexConfig configures a mutex system.
type MutexConfig struct {
	// Addrs are the servers: one, or N independent ones for Redlock systems.
	Addrs []string
	// Lease is the lock's validity; 10s when zero.
	Lease time.Duration
	// Retry is the delay between attempts of the systems that wait by polling
	// (redsync, bsm/redislock, raw); 1ms when zero.
	Retry time.Duration
	// Counter counts the commands sent (may be nil).
	Counter *Counter
}

// Mutex is one distributed lock implementation.
type Mutex interface {
	// Acquire waits until name is held by the caller, or ctx ends.
	Acquire(ctx context.Context, name string) (Held, error)
	// Close releases the system's clients.
	Close() error
}

// Held is an acquired lock.
type Held interface {
	Release(ctx context.Context) error
}

// NewMutex returns the named mutex system.
func NewMutex(name string, cfg MutexConfig) (Mutex, error) {
	if cfg.Lease == 0 {
		cfg.Lease = 10 * time.Second
	}
	if cfg.Retry == 0 {
		cfg.Retry = time.Millisecond
	}
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("systems: no Redis address")
	}
	switch name {
	case Locks, LocksFair:
		rdb := NewRedis(cfg.Addrs[0], cfg.Counter)
		m := &locksMutex{rdb: rdb, c: locks.New(rdb, locks.Lease(cfg.Lease))}
		if name == LocksFair {
			m.opts = []locks.CallOption{locks.Fair()}
		}
		return m, nil
	case LocksScripts:
		return &scriptsMutex{rdb: NewRedis(cfg.Addrs[0], cfg.Counter), lease: cfg.Lease}, nil
	case Redsync:
		m := &redsyncMutex{opts: []redsync.Option{
			redsync.WithExpiry(cfg.Lease),
			redsync.WithTries(1 << 30), // wait until ctx ends, like the others
			redsync.WithRetryDelay(cfg.Retry),
		}}
		pools := make([]redsyncredis.Pool, 0, len(cfg.Addrs))
		for _, a := range cfg.Addrs {
			rdb := NewRedis(a, cfg.Counter)
			m.rdbs = append(m.rdbs, rdb)
			pools = append(pools, goredis.NewPool(rdb))
		}
		m.rs = redsync.New(pools...)
		return m, nil
	case BSM:
		rdb := NewRedis(cfg.Addrs[0], cfg.Counter)
		return &bsmMutex{rdb: rdb, c: redislock.New(rdb), lease: cfg.Lease,
			opt: &redislock.Options{RetryStrategy: redislock.LinearBackoff(cfg.Retry)}}, nil
	case Rueidislock:
		l, err := rueidislock.NewLocker(rueidislock.LockerOption{
			ClientOption: rueidis.ClientOption{InitAddress: []string{cfg.Addrs[0]}},
			KeyValidity:  cfg.Lease,
			// Its defaults. NoLoopTracking (documented as faster on Redis ≥ 7.0.5)
			// lost wake-ups here: under the stampede some waiters slept until
			// their context ended.
			ClientBuilder: func(o rueidis.ClientOption) (rueidis.Client, error) {
				c, err := rueidis.NewClient(o)
				if err != nil || cfg.Counter == nil {
					return c, err
				}
				return countingRueidis{Client: c, c: cfg.Counter}, nil
			},
		})
		if err != nil {
			return nil, err
		}
		return rueidisMutex{l}, nil
	case RawSetNX:
		rdb := NewRedis(cfg.Addrs[0], cfg.Counter)
		return &rawMutex{rdb: rdb, lease: cfg.Lease, retry: cfg.Retry}, nil
	case Redlock:
		m := &redlockMutex{}
		clients := make([]redis.UniversalClient, 0, len(cfg.Addrs))
		for _, a := range cfg.Addrs {
			rdb := NewRedis(a, cfg.Counter)
			m.rdbs = append(m.rdbs, rdb)
			clients = append(clients, rdb)
		}
		rl := locks.NewRedlock(clients, locks.Lease(cfg.Lease))
		m.rl = rl
		return m, nil
	}
	return nil, fmt.Errorf("systems: unknown mutex %q", name)
}

// --- cacheguard locks

type locksMutex struct {
	rdb  *redis.Client
	c    *locks.Client
	opts []locks.CallOption
}

func (m *locksMutex) Acquire(ctx context.Context, name string) (Held, error) {
	l, err := m.c.Lock(ctx, name, m.opts...)
	if err != nil {
		return nil, err
	}
	return locksHeld{l}, nil
}

type locksHeld struct{ l *locks.Lock }

func (h locksHeld) Release(ctx context.Context) error { return h.l.Unlock(ctx) }

func (m *locksMutex) Close() error {
	m.c.Close()
	return m.rdb.Close()
}

// --- cacheguard locks' scripts, replayed raw (a control)

// scriptsMutex replays the two command lines a locks.Client sent for one Lock
// and Unlock (captured once, by a hook, on a client of its own, for the name
// captureName): the same scripts, keys and arguments, sent through go-redis
// on the caller's goroutine, the release carrying the acquire's reply (the
// fence token) where the captured one did. Another name's lines are the
// captured ones with the name replaced in their keys (a name without braces
// is its keys' hash tag). Its cycle costs what the scripts cost in Redis and
// on the wire, without the lock's own machinery; a name another caller holds
// is not waited for (the scenarios it runs in are uncontended).
type scriptsMutex struct {
	rdb   *redis.Client
	lease time.Duration
	once  sync.Once
	base  scriptLines
	err   error
	lines sync.Map // name -> scriptLines
}

const captureName = "cgbench-capture"

type scriptLines struct {
	acquire, release []any
	fence            int // index in release of the captured acquire's reply
}

// captureHook records the EVALSHA command lines a client sends, each with
// its reply.
type captureHook struct{ lines *[][]any }

func (captureHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h captureHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "evalsha" {
			c, _ := rcmd.AsCmd(cmd) // a lock request is a rcmd.OnceCmd
			*h.lines = append(*h.lines, append([]any(nil), cmd.Args()...), []any{c.Val()})
		}
		return err
	}
}
func (captureHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (m *scriptsMutex) capture(ctx context.Context) {
	var got [][]any
	rdb := redis.NewClient(&redis.Options{Addr: m.rdb.Options().Addr})
	defer rdb.Close()
	rdb.AddHook(captureHook{&got})
	c := locks.New(rdb, locks.Lease(m.lease))
	defer c.Close()
	lk, err := c.Lock(ctx, captureName)
	if err == nil {
		err = lk.Unlock(ctx)
	}
	if err != nil {
		m.err = err
		return
	}
	if len(got) != 4 {
		m.err = fmt.Errorf("systems: captured %d script calls of a lock cycle, want 2", len(got)/2)
		return
	}
	m.base = scriptLines{acquire: got[0], release: got[2], fence: -1}
	for i, v := range m.base.release {
		if i > 2 && v == got[1][0] {
			m.base.fence = i
		}
	}
}

// linesOf returns name's command lines.
func (m *scriptsMutex) linesOf(ctx context.Context, name string) (scriptLines, error) {
	if l, ok := m.lines.Load(name); ok {
		return l.(scriptLines), nil
	}
	m.once.Do(func() { m.capture(ctx) })
	if m.err != nil {
		return scriptLines{}, m.err
	}
	rename := func(line []any) []any {
		out := slices.Clone(line)
		n, _ := strconv.Atoi(fmt.Sprint(line[2]))
		for i := 3; i < 3+n; i++ {
			out[i] = strings.ReplaceAll(line[i].(string), captureName, name)
		}
		return out
	}
	l := scriptLines{acquire: rename(m.base.acquire), release: rename(m.base.release), fence: m.base.fence}
	m.lines.Store(name, l)
	return l, nil
}

func (m *scriptsMutex) Acquire(ctx context.Context, name string) (Held, error) {
	l, err := m.linesOf(ctx, name)
	if err != nil {
		return nil, err
	}
	v, err := m.rdb.Do(ctx, l.acquire...).Result()
	if err != nil {
		return nil, err
	}
	if _, ok := v.(string); !ok {
		return nil, fmt.Errorf("systems: %s: the replayed acquire was not granted (%v)", name, v)
	}
	rel := l.release
	if l.fence >= 0 {
		rel = slices.Clone(rel)
		rel[l.fence] = v
	}
	return scriptsHeld{m.rdb, rel}, nil
}

type scriptsHeld struct {
	rdb  *redis.Client
	line []any
}

func (h scriptsHeld) Release(ctx context.Context) error { return h.rdb.Do(ctx, h.line...).Err() }

func (m *scriptsMutex) Close() error { return m.rdb.Close() }

// --- cacheguard Redlock

type redlockMutex struct {
	rl   *locks.Redlock
	rdbs []*redis.Client
}

func (m *redlockMutex) Acquire(ctx context.Context, name string) (Held, error) {
	l, err := m.rl.Lock(ctx, name)
	if err != nil {
		return nil, err
	}
	return locksHeld{l}, nil
}

func (m *redlockMutex) Close() error {
	var errs []error
	if m.rl != nil {
		errs = append(errs, m.rl.Close())
	}
	for _, r := range m.rdbs {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

// --- redsync

type redsyncMutex struct {
	rs   *redsync.Redsync
	rdbs []*redis.Client
	opts []redsync.Option
}

type redsyncHeld struct{ m *redsync.Mutex }

func (h redsyncHeld) Release(ctx context.Context) error {
	_, err := h.m.UnlockContext(ctx)
	return err
}

func (m *redsyncMutex) Acquire(ctx context.Context, name string) (Held, error) {
	mu := m.rs.NewMutex(name, m.opts...)
	if err := mu.LockContext(ctx); err != nil {
		return nil, err
	}
	return redsyncHeld{mu}, nil
}

func (m *redsyncMutex) Close() error {
	var errs []error
	for _, r := range m.rdbs {
		errs = append(errs, r.Close())
	}
	return errors.Join(errs...)
}

// --- bsm/redislock

type bsmMutex struct {
	rdb   *redis.Client
	c     *redislock.Client
	lease time.Duration
	opt   *redislock.Options
}

func (m *bsmMutex) Acquire(ctx context.Context, name string) (Held, error) {
	l, err := m.c.Obtain(ctx, name, m.lease, m.opt)
	if err != nil {
		return nil, err
	}
	return l, nil
}

func (m *bsmMutex) Close() error { return m.rdb.Close() }

// --- rueidislock

type rueidisMutex struct{ l rueidislock.Locker }

type cancelHeld context.CancelFunc

func (h cancelHeld) Release(context.Context) error {
	h()
	return nil
}

func (m rueidisMutex) Acquire(ctx context.Context, name string) (Held, error) {
	_, cancel, err := m.l.WithContext(ctx, name)
	if err != nil {
		return nil, err
	}
	return cancelHeld(cancel), nil
}

func (m rueidisMutex) Close() error {
	m.l.Close()
	return nil
}

// --- raw SET NX PX, released by a compare-and-delete script

//go:embed release.lua
var rawReleaseLua string

var rawRelease = redis.NewScript(rawReleaseLua)

type rawMutex struct {
	rdb   *redis.Client
	lease time.Duration
	retry time.Duration
}

type rawHeld struct {
	m          *rawMutex
	key, token string
}

func (h *rawHeld) Release(ctx context.Context) error {
	return rawRelease.Run(ctx, h.m.rdb, []string{h.key}, h.token).Err()
}

func (m *rawMutex) Acquire(ctx context.Context, name string) (Held, error) {
	token := strconv.FormatUint(rand.Uint64(), 36) + strconv.FormatUint(rand.Uint64(), 36)
	for {
		ok, err := m.rdb.SetNX(ctx, name, token, m.lease).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			return &rawHeld{m: m, key: name, token: token}, nil
		}
		t := time.NewTimer(m.retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

func (m *rawMutex) Close() error { return m.rdb.Close() }

// Available reports whether the named system (mutex or cache) can run on this
// branch: ErrNotMerged for cacheguard systems whose code is not merged yet.
func Available(name string) error {
	switch name {
	case Locks, LocksFair, Redsync, BSM, Rueidislock, RawSetNX, LocksScripts, Redlock,
		Naive, RawGetDecode, Singleflight, SingleflightLoad, GoRedisCache, GoRedisGet, LockRedsync, LockBSM, LockRueidis,
		GoRedisLocal, Guard, GuardHandOff, GuardTimeouts, GuardMsgPack, GuardStale, GuardSWR, GuardNear:
		return nil
	}
	return fmt.Errorf("systems: unknown system %q", name)
}
