package cacheguard_test

// Regression tests for the defects an outside probe found: each names the
// rule it checks.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// logger is a Logger that writes to b.
func (b *syncBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// An Observer is user code: its panic is recovered and logged wherever the
// Guard calls it, and what reported the event goes on. A panic on EventLoad
// used to escape the fill, leaving its lease renewed until the load timeout.
func TestObserverPanicOnLoadReleasesLease(t *testing.T) {
	ctx := context.Background()
	var logs syncBuffer
	var once sync.Once
	g, rdb := newGuard(t, cacheguard.Logger(logs.logger()), cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
		if e.Kind == cacheguard.EventLoad {
			once.Do(func() { panic("observer boom") })
		}
	}))
	key := testKey(t)
	v, err := cacheguard.Get(ctx, g, key, func(context.Context) (item, error) { return item{Name: "v"}, nil },
		cacheguard.LoadTimeout(time.Minute))
	if err != nil || v.Name != "v" {
		t.Fatalf("Get with an Observer panicking on EventLoad = %v, %v; want the loaded value", v, err)
	}
	if n := rdb.Exists(ctx, leaseKey(key)).Val(); n != 0 {
		t.Fatalf("fill lease left in Redis after the Observer panicked (pttl %v)", rdb.PTTL(ctx, leaseKey(key)).Val())
	}
	var r cacheguard.Result
	if v, err := cacheguard.Get(ctx, g, key, func(context.Context) (item, error) { return item{Name: "w"}, nil },
		cacheguard.ReportTo(&r)); err != nil || v.Name != "v" || r != cacheguard.Hit {
		t.Fatalf("next Get = %v, %v, %v; want a Hit of the stored value", v, err, r)
	}
	if s := logs.String(); !strings.Contains(s, "Observer panicked") || !strings.Contains(s, "observer boom") {
		t.Errorf("the Observer's panic was not logged: %q", s)
	}
}

// An Observer panicking on the shared subscription's goroutine
// (EventNearInvalidated) used to kill the process; the subscription goes on.
func TestObserverPanicOnSubscriptionGoroutine(t *testing.T) {
	ctx := context.Background()
	a, _ := newGuard(t, cacheguard.Logger(slog.New(slog.DiscardHandler)), cacheguard.NearCache(10, time.Minute),
		cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
			if e.Kind == cacheguard.EventNearInvalidated {
				panic("observer boom near")
			}
		}))
	b, _ := newGuard(t)
	key := testKey(t)
	for i := range 2 {
		load := func(context.Context) (item, error) { return item{ID: i}, nil }
		eventually(t, 5*time.Second, "a near-cache hit", func() bool {
			var r cacheguard.Result
			_, err := cacheguard.Get(ctx, a, key, load, cacheguard.ReportTo(&r))
			return err == nil && r == cacheguard.NearHit
		})
		heard := cacheguard.NearHeard(a, key)
		if err := b.Invalidate(ctx, key); err != nil {
			t.Fatal(err)
		}
		// The second round needs the subscription alive after the first panic.
		eventually(t, 5*time.Second, "a's near cache to drop the key", func() bool { return cacheguard.NearHeard(a, key) > heard })
	}
}

// Every duration an option sets is bounded by MaxDuration: a longer one is
// refused with ErrInvalid naming the option, in a call and in New (a panic),
// and one of MaxDuration works — a value stored and served, its times adding
// up without overflow. TTL(math.MaxInt64) used to be accepted and to overflow
// the value's times: every call loaded again.
func TestDurationsBoundedByMaxDuration(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.Logger(slog.New(slog.DiscardHandler)))
	long := cacheguard.MaxDuration
	for _, tc := range []struct {
		name string
		opt  func(time.Duration) cacheguard.Setting
	}{
		{"TTL", cacheguard.TTL},
		{"ServeStale", cacheguard.ServeStale},
		{"StaleGrace", cacheguard.StaleGrace},
		{"WaitBudget", cacheguard.WaitBudget},
		{"NegativeTTL", cacheguard.NegativeTTL},
		{"LoadTimeout", cacheguard.LoadTimeout},
		{"Lease", cacheguard.Lease},
		{"FailSafe max age", func(d time.Duration) cacheguard.Setting { return cacheguard.FailSafe(d, time.Second) }},
		{"FailSafe back-off", func(d time.Duration) cacheguard.Setting { return cacheguard.FailSafe(time.Minute, d) }},
		{"SoftTimeout", cacheguard.SoftTimeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, d := range []time.Duration{long + 1, math.MaxInt64} {
				_, err := cacheguard.Get(ctx, g, testKey(t), (&counter{}).load, tc.opt(d))
				if !errors.Is(err, cacheguard.ErrInvalid) || !strings.Contains(err.Error(), tc.name) {
					t.Errorf("Get with %s(%v) = %v; want an ErrInvalid naming %s", tc.name, d, err, tc.name)
				}
				if p := panicOf(func() { cacheguard.New(shared(t), tc.opt(d)) }); !strings.Contains(fmt.Sprint(p), tc.name) {
					t.Errorf("New with %s(%v) panicked with %v; want a message naming it", tc.name, d, p)
				}
			}
			key := testKey(t)
			c := &counter{name: "v"}
			for i := range 2 {
				var r cacheguard.Result
				v, err := cacheguard.Get(ctx, g, key, c.load, tc.opt(long), cacheguard.ReportTo(&r))
				if err != nil || v.ID != 1 || i == 1 && r != cacheguard.Hit {
					t.Fatalf("Get %d with %s(MaxDuration) = %v, %v, %v; want the first load, then a Hit", i, tc.name, v, err, r)
				}
			}
		})
	}
	t.Run("NegativeTTL absence", func(t *testing.T) {
		key := testKey(t)
		var n atomic.Int64
		load := func(context.Context) (item, error) { n.Add(1); return item{}, cacheguard.ErrNotFound }
		for i := range 2 {
			var r cacheguard.Result
			_, err := cacheguard.Get(ctx, g, key, load, cacheguard.NegativeTTL(long), cacheguard.ReportTo(&r))
			if !errors.Is(err, cacheguard.ErrNotFound) || n.Load() != 1 || i == 1 && r != cacheguard.Hit {
				t.Fatalf("Get %d = %v, loads %d, result %v: want a cached absence", i, err, n.Load(), r)
			}
		}
	})
	for _, opt := range []cacheguard.Option{cacheguard.CommandTimeout(long + 1), cacheguard.NearCache(10, long+1)} {
		if p := panicOf(func() { cacheguard.New(shared(t), opt) }); !strings.Contains(fmt.Sprint(p), "MaxDuration") {
			t.Errorf("New with a Guard option past MaxDuration panicked with %v", p)
		}
	}
}

// panicOf returns what f panicked with, or nil.
func panicOf(f func()) (p any) {
	defer func() { p = recover() }()
	f()
	return nil
}

// A caller whose context ended is not a Redis failure: Invalidate and
// InvalidateTags return ctx's error (not ErrUnavailable) and count no Redis
// error, as reads do (TestPassedDeadlineIsNotARedisFailure).
func TestInvalidateCancelledIsNotUnavailable(t *testing.T) {
	var events atomic.Int64
	g, _ := newGuard(t, cacheguard.Logger(slog.New(slog.DiscardHandler)), cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
		if e.Kind == cacheguard.EventRedisError {
			events.Add(1)
		}
	}))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	key := testKey(t)
	for name, f := range map[string]func() error{
		"Invalidate":     func() error { return g.Invalidate(ctx, key) },
		"InvalidateTags": func() error { return g.InvalidateTags(ctx, key+"t") },
	} {
		if err := f(); err != nil && (!errors.Is(err, context.Canceled) || errors.Is(err, cacheguard.ErrUnavailable)) {
			t.Errorf("%s under a cancelled context = %v; want ctx's error, not ErrUnavailable", name, err)
		}
	}
	if n, st := events.Load(), g.Stats().RedisErrors; n != 0 || st != 0 {
		t.Errorf("the caller's cancellation counted as %d Redis errors (%d events)", st, n)
	}
}

// WaitBudget(0) waits for no load, as TryLock does for a lock: a hit is
// served (it used to fail with ErrWaitTimeout and count a Redis error), and a
// miss ends the budget at once — the call does not wait for the load it
// starts.
func TestWaitBudgetZeroReadsOnce(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	warm := testKey(t, "warm")
	c := &counter{name: "v"}
	if _, err := cacheguard.Get(ctx, g, warm, c.load); err != nil {
		t.Fatal(err)
	}
	for _, opts := range [][]cacheguard.CallOption{nil, {cacheguard.Tags("t")}} {
		if len(opts) > 0 { // a tagged entry of its own, loaded first
			if _, err := cacheguard.Get(ctx, g, warm, c.load, opts...); err != nil {
				t.Fatal(err)
			}
		}
		var r cacheguard.Result
		v, err := cacheguard.Get(ctx, g, warm, c.load, append(opts, cacheguard.WaitBudget(0), cacheguard.ReportTo(&r))...)
		if err != nil || r != cacheguard.Hit || v.Name != "v" {
			t.Errorf("warm key, WaitBudget(0), %d tags: %v, %v, %v; want a Hit", len(opts), v, err, r)
		}
		vs, err := cacheguard.GetMany(ctx, g, []string{warm}, func(context.Context, []string) (map[string]item, error) {
			return nil, errors.New("loaded")
		}, append(opts, cacheguard.WaitBudget(0))...)
		if err != nil || len(vs) != 1 {
			t.Errorf("warm key, GetMany, WaitBudget(0), %d tags: %v, %v; want its value", len(opts), vs, err)
		}
	}
	cold := testKey(t, "cold")
	gt := newGated("gated")
	_, err := cacheguard.Get(ctx, g, cold, gt.load, cacheguard.WaitBudget(0))
	close(gt.release) // the call returned before its load could end
	if !errors.Is(err, cacheguard.ErrWaitTimeout) {
		t.Errorf("cold key, WaitBudget(0): %v, want ErrWaitTimeout", err)
	}
	if st := g.Stats(); st.RedisErrors != 0 || st.Hits != 4 {
		t.Errorf("Stats %+v: want 4 hits and no Redis error", st)
	}
}

// A wait budget that ends during a read while Redis is healthy but slow is a
// wait timeout, not a failed Redis call.
func TestBudgetEndDuringReadIsNoRedisError(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t)
	key := testKey(t)
	if _, err := cacheguard.Get(ctx, g, key, (&counter{}).load); err != nil {
		t.Fatal(err)
	}
	hold, release := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(release) })
	rdb.AddHook(holdHook{hold: hold, release: release})
	close(hold) // from now on each command waits for its context or release
	_, err := cacheguard.Get(ctx, g, key, (&counter{}).load, cacheguard.WaitBudget(50*time.Millisecond))
	if !errors.Is(err, cacheguard.ErrWaitTimeout) {
		t.Errorf("budget ending during a held read: %v, want ErrWaitTimeout", err)
	}
	if st := g.Stats(); st.RedisErrors != 0 || st.WaitTimeouts != 1 {
		t.Errorf("Stats %+v: want 1 wait timeout and no Redis error", st)
	}
}

// holdHook holds every command sent once hold is closed until its context
// ends or release is closed: a Redis slower than the caller's budget.
type holdHook struct{ hold, release chan struct{} }

func (h holdHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h holdHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.wait(ctx)
		return next(ctx, cmds)
	}
}
func (h holdHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.wait(ctx)
		return next(ctx, cmd)
	}
}
func (h holdHook) wait(ctx context.Context) {
	select {
	case <-h.hold:
	default:
		return
	}
	select {
	case <-ctx.Done():
	case <-h.release:
	}
}

// A panic is a failed load whatever its value: panic(ErrClosed) used to be
// taken for a loader declining its load (no EventLoad, the fill handed over),
// since *PanicError unwraps to the panic's error; nor is panic(ErrNotFound)
// an absence, nor panic(ErrUncached) an uncached result.
func TestPanicWithSentinelValueIsAFailedLoad(t *testing.T) {
	ctx := context.Background()
	for _, pv := range []error{cacheguard.ErrClosed, cacheguard.ErrNotFound, cacheguard.ErrUncached} {
		t.Run(pv.Error(), func(t *testing.T) {
			var loads atomic.Int64
			g, rdb := newGuard(t, cacheguard.Logger(slog.New(slog.DiscardHandler)), cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
				if e.Kind == cacheguard.EventLoad {
					loads.Add(1)
				}
			}))
			key := testKey(t)
			_, err := cacheguard.Get(ctx, g, key, func(context.Context) (item, error) { panic(pv) })
			var pe *cacheguard.PanicError
			if !errors.As(err, &pe) {
				t.Errorf("loader panicking with %v: %v (%T), want a *PanicError", pv, err, err)
			}
			if n, st := loads.Load(), g.Stats().Loads; n != 1 || st != 1 {
				t.Errorf("panicked load counted %d times (%d events), want once", st, n)
			}
			if n := rdb.Exists(ctx, leaseKey(key)).Val(); n != 0 {
				t.Errorf("fill lease left after the panic")
			}
			var r cacheguard.Result
			v, err := cacheguard.Get(ctx, g, key, func(context.Context) (item, error) { return item{Name: "ok"}, nil },
				cacheguard.ReportTo(&r))
			if err != nil || v.Name != "ok" || r != cacheguard.Miss {
				t.Errorf("next Get after a panic(%v): %v, %v, %v; want a fresh load", pv, v, err, r)
			}
		})
	}
}

// Tags() with no tag is no Tags at all: the entry of a call without Tags, a
// Hit once loaded. It used to make a tagged entry of no tags that no read
// took for current: every call loaded again.
func TestEmptyTagsIsNoTags(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	key := testKey(t)
	c := &counter{name: "v"}
	for i, opts := range [][]cacheguard.CallOption{{cacheguard.Tags()}, {cacheguard.Tags()}, nil, {cacheguard.Tags("t"), cacheguard.Tags()}} {
		var r cacheguard.Result
		if _, err := cacheguard.Get(ctx, g, key, c.load, append(opts, cacheguard.ReportTo(&r))...); err != nil {
			t.Fatal(err)
		}
		if i > 0 && r != cacheguard.Hit {
			t.Errorf("Get %d (%d options) was %v: want a Hit of the first load", i, len(opts), r)
		}
	}
	vs, err := cacheguard.GetMany(ctx, g, []string{key}, func(context.Context, []string) (map[string]item, error) {
		return nil, errors.New("loaded")
	}, cacheguard.Tags())
	if err != nil || len(vs) != 1 {
		t.Errorf("GetMany with Tags(): %v, %v; want the cached value", vs, err)
	}
	if n := c.n.Load(); n != 1 {
		t.Errorf("%d loads, want 1", n)
	}
}

// A bad tag is an ErrInvalid prefixed "cacheguard: " like every error of the
// package (it was "tag: cacheguard: invalid argument: empty key").
func TestTagErrorsArePackagePrefixed(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	long := strings.Repeat("x", cacheguard.MaxKeyLen+1)
	for name, f := range map[string]func() error{
		"Get, empty tag": func() error {
			_, err := cacheguard.Get(ctx, g, "k", (&counter{}).load, cacheguard.Tags(""))
			return err
		},
		"Get, long tag": func() error {
			_, err := cacheguard.Get(ctx, g, "k", (&counter{}).load, cacheguard.Tags(long))
			return err
		},
		"InvalidateTags, empty":   func() error { return g.InvalidateTags(ctx, "") },
		"InvalidateTags, long":    func() error { return g.InvalidateTags(ctx, long) },
		"CheckCallOptions, empty": func() error { return g.CheckCallOptions(cacheguard.Tags("a", "")) },
	} {
		if err := f(); !errors.Is(err, cacheguard.ErrInvalid) || !strings.HasPrefix(err.Error(), "cacheguard: ") || !strings.Contains(err.Error(), "tag") {
			t.Errorf("%s: %q, want an ErrInvalid starting \"cacheguard: \" naming the tag", name, err)
		}
	}
}
