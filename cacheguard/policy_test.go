package cacheguard_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/logtest"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// gated is a loader that announces each call on entered and returns only when
// release is closed (or its context ends).
type gated struct {
	counter
	entered chan int64
	release chan struct{}
}

func newGated(name string) *gated {
	return &gated{counter: counter{name: name}, entered: make(chan int64, 16), release: make(chan struct{})}
}

func (l *gated) load(ctx context.Context) (item, error) {
	n := l.n.Add(1)
	l.entered <- n
	select {
	case <-l.release:
		return item{ID: int(n), Name: l.name}, nil
	case <-ctx.Done():
		return item{}, ctx.Err()
	}
}

// stallsOnce is a loader whose first call is gated (a load that stalls until
// released) and whose later calls load at once, named "reload": a call that
// stops waiting for the stalled load (its flight turned unfit) loads again.
type stallsOnce struct {
	*gated
	reload counter
	calls  atomic.Int64
}

func newStallsOnce(name string) *stallsOnce {
	return &stallsOnce{gated: newGated(name), reload: counter{name: "reload"}}
}

func (l *stallsOnce) load(ctx context.Context) (item, error) {
	if l.calls.Add(1) == 1 {
		return l.gated.load(ctx)
	}
	return l.reload.load(ctx)
}

func TestServeStaleWithoutWaitingOneRefresh(t *testing.T) {
	ctx := context.Background()
	opts := []cacheguard.Option{cacheguard.TTL(50 * time.Millisecond), cacheguard.ServeStale(time.Minute),
		cacheguard.Jitter(0), cacheguard.EarlyRefresh(0), cacheguard.WaitBudget(5 * time.Second)}
	a, rdb := newGuard(t, opts...)
	b, _ := newGuard(t, opts...)
	key := testKey(t)
	first := &counter{name: "v1"}
	if _, err := cacheguard.Get(ctx, a, key, first.load); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, valueKey(key)).Val(); ttl < 59*time.Second {
		t.Fatalf("value TTL %v, want TTL + stale window", ttl)
	}
	loadedAt := time.Now()
	// Time is the subject here: wait until the value is past its fresh TTL.
	eventually(t, time.Second, "value stale", func() bool { return time.Since(loadedAt) > 60*time.Millisecond })

	refresh := newGated("v2")
	const n = 50
	var wg sync.WaitGroup
	errs := make([]error, 2*n)
	for i := range 2 * n {
		g := a
		if i%2 == 1 {
			g = b
		}
		wg.Go(func() {
			var res cacheguard.Result
			v, err := cacheguard.Get(ctx, g, key, refresh.load, cacheguard.ReportTo(&res))
			if err == nil && (v.Name != "v1" || res != cacheguard.Stale) {
				err = fmt.Errorf("got %v (%v), want v1 STALE", v, res)
			}
			errs[i] = err
		})
	}
	wg.Wait() // every call returned while the refresh is still blocked in its loader
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	<-refresh.entered
	close(refresh.release)
	var res cacheguard.Result
	eventually(t, 5*time.Second, "refreshed value served", func() bool {
		v, err := cacheguard.Get(ctx, a, key, refresh.load, cacheguard.ReportTo(&res))
		return err == nil && v.Name == "v2" && res == cacheguard.Hit
	})
	if got := refresh.n.Load(); got != 1 {
		t.Fatalf("refresh loads = %d, want 1", got)
	}
	if st := a.Stats(); st.StaleServed < n {
		t.Fatalf("stale served by a = %d, want at least %d", st.StaleServed, n)
	}
}

func TestStaleValueUnderWaitPolicyWaits(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.TTL(30*time.Millisecond), cacheguard.ServeStale(time.Minute), cacheguard.Jitter(0), cacheguard.EarlyRefresh(0))
	key := testKey(t)
	if _, err := cacheguard.Get(ctx, g, key, (&counter{name: "v1"}).load); err != nil {
		t.Fatal(err)
	}
	loadedAt := time.Now()
	eventually(t, time.Second, "value stale", func() bool { return time.Since(loadedAt) > 40*time.Millisecond })
	var res cacheguard.Result
	v, err := cacheguard.Get(ctx, g, key, (&counter{name: "v2"}).load, cacheguard.Wait(), cacheguard.WaitBudget(time.Second), cacheguard.ReportTo(&res))
	if err != nil || v.Name != "v2" || res != cacheguard.Miss {
		t.Fatalf("Wait on a stale value = %v, %v, %v; want a fresh load", v, err, res)
	}
}

func TestFailFast(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.FailFast())
	key := testKey(t)
	l := newGated("ff")
	var res cacheguard.Result
	if _, err := cacheguard.Get(ctx, g, key, l.load, cacheguard.ReportTo(&res)); !errors.Is(err, cacheguard.ErrMiss) || res != cacheguard.Miss {
		t.Fatalf("cold FailFast = %v, %v; want ErrMiss, MISS", err, res)
	}
	<-l.entered // the background fill runs
	if _, err := cacheguard.Get(ctx, g, key, l.load); !errors.Is(err, cacheguard.ErrMiss) {
		t.Fatalf("FailFast during the fill = %v, want ErrMiss", err)
	}
	close(l.release)
	eventually(t, 5*time.Second, "filled", func() bool {
		v, err := cacheguard.Get(ctx, g, key, l.load, cacheguard.ReportTo(&res))
		return err == nil && v.Name == "ff" && res == cacheguard.Hit
	})
	if got := l.n.Load(); got != 1 {
		t.Fatalf("loads = %d, want 1", got)
	}
}

func TestWaitTimeoutAndLoadOnTimeout(t *testing.T) {
	ctx := context.Background()
	a, rdb := newGuard(t)
	b, _ := newGuard(t)
	key := testKey(t)
	holder := newGated("holder")
	done := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, a, key, holder.load)
		done <- err
	}()
	<-holder.entered

	start := time.Now()
	other := &counter{name: "other"}
	var res cacheguard.Result
	_, err := cacheguard.Get(ctx, b, key, other.load, cacheguard.Wait(), cacheguard.WaitBudget(100*time.Millisecond), cacheguard.ReportTo(&res))
	if !errors.Is(err, cacheguard.ErrWaitTimeout) || res != cacheguard.Miss {
		t.Fatalf("Get = %v (%v), want ErrWaitTimeout", err, res)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("waited %v", waited)
	}
	v, err := cacheguard.Get(ctx, b, key, other.load, cacheguard.Wait(), cacheguard.WaitBudget(50*time.Millisecond), cacheguard.OnWaitTimeout(cacheguard.TimeoutLoad), cacheguard.ReportTo(&res))
	if err != nil || v.Name != "other" || res != cacheguard.Miss {
		t.Fatalf("LoadOnTimeout = %v, %v, %v; want the call's own load", v, err, res)
	}
	if n := rdb.Exists(ctx, valueKey(key)).Val(); n != 0 {
		t.Fatal("a load without the lease was stored")
	}
	close(holder.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := b.Stats(); st.WaitTimeouts != 2 {
		t.Fatalf("wait timeouts = %d, want 2", st.WaitTimeouts)
	}
}

func TestNegativeCaching(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	key := testKey(t)
	loads := 0
	missing := func(context.Context) (item, error) {
		loads++
		return item{}, fmt.Errorf("user 9: %w", cacheguard.ErrNotFound)
	}
	var res cacheguard.Result
	if _, err := cacheguard.Get(ctx, g, key, missing); !errors.Is(err, cacheguard.ErrNotFound) || err.Error() != "user 9: cacheguard: not found" {
		t.Fatalf("first Get = %v, want the loader's ErrNotFound", err)
	}
	if _, err := cacheguard.Get(ctx, g, key, missing, cacheguard.ReportTo(&res)); !errors.Is(err, cacheguard.ErrNotFound) || res != cacheguard.Hit {
		t.Fatalf("second Get = %v (%v), want a cached ErrNotFound", err, res)
	}
	if loads != 1 || g.Stats().NegativeHits != 1 {
		t.Fatalf("loads %d, stats %+v", loads, g.Stats())
	}

	off := testKey(t, "off")
	for range 2 {
		cacheguard.Get(ctx, g, off, missing, cacheguard.NegativeTTL(0))
	}
	if loads != 3 {
		t.Fatalf("with NegativeTTL(0): loads %d, want 3", loads)
	}
}

// TestEarlyRefresh: a hit close to expiry refreshes the value in the
// background — no earlier than the last quarter of the TTL, whatever β — and
// the refreshed value is stored for a full TTL: the jitter shortens the TTL
// of values loaded on a miss, not of early refreshes, which their leads
// spread already (each costed a load's worth of jitter before).
func TestEarlyRefresh(t *testing.T) {
	ctx := context.Background()
	const ttl = 2 * time.Second
	// β so large that every hit within the last quarter (500ms) refreshes.
	g, rdb := newGuard(t, cacheguard.EarlyRefresh(1e9), cacheguard.TTL(ttl), cacheguard.Jitter(0.9))
	key := testKey(t)
	c := &counter{delay: time.Millisecond, name: "e"}
	freshUntil := func() time.Time {
		b, _ := rdb.HGet(ctx, valueKey(key), itemField).Bytes()
		if len(b) < 32 {
			return time.Time{}
		}
		return time.UnixMilli(int64(binary.BigEndian.Uint64(b[4:])))
	}
	if _, err := cacheguard.Get(ctx, g, key, c.load); err != nil {
		t.Fatal(err)
	}
	first := freshUntil()
	var res cacheguard.Result
	v, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res))
	if err != nil || v.ID != 1 || res != cacheguard.Hit {
		t.Fatalf("hit = %v, %v, %v", v, err, res)
	}
	if time.Until(first) > ttl/4 && g.Stats().EarlyRefreshes != 0 {
		t.Fatalf("an early refresh %v before expiry, more than a quarter of the TTL", time.Until(first))
	}
	// Read until a hit falls within the last quarter and refreshes (in the
	// background: seen once this hit or the one before it has returned).
	var start, before time.Time
	eventually(t, 5*time.Second, "refreshed in the background", func() bool {
		before, start = start, time.Now()
		_, err := cacheguard.Get(ctx, g, key, c.load)
		return err == nil && g.Stats().EarlyRefreshes == 1
	})
	if !before.IsZero() {
		start = before
	}
	eventually(t, 5*time.Second, "the refresh stored", func() bool { return c.n.Load() == 2 && !freshUntil().Equal(first) })
	if fu := freshUntil(); fu.Before(start.Add(ttl)) {
		t.Fatalf("refreshed value fresh until %v after the refreshing hit, want the full TTL %v (an early refresh is not jittered)", fu.Sub(start), ttl)
	}
	if st := g.Stats(); st.Misses != 1 || st.Loads != 2 {
		t.Fatalf("stats %+v, want one miss and one early refresh (the refresh ends before expiry)", st)
	}
}

// A value loaded after a miss has its TTL shortened by the jitter.
func TestJitterOnMisses(t *testing.T) {
	ctx := context.Background()
	const ttl = time.Hour
	g, rdb := newGuard(t, cacheguard.TTL(ttl), cacheguard.Jitter(0.9))
	shortest := ttl
	for i := range 5 {
		key := testKey(t, fmt.Sprint(i))
		start := time.Now()
		if _, err := cacheguard.Get(ctx, g, key, (&counter{}).load); err != nil {
			t.Fatal(err)
		}
		b, _ := rdb.HGet(ctx, valueKey(key), itemField).Bytes()
		shortest = min(shortest, time.UnixMilli(int64(binary.BigEndian.Uint64(b[4:]))).Sub(start))
	}
	if shortest > ttl*95/100 {
		t.Fatalf("5 misses with Jitter(0.9): the shortest TTL is %v of %v", shortest, ttl)
	}
}

// The observer sees every outcome with the context of the call that produced
// it — the load, run in the background, with a context that keeps the
// call's values — so telemetry can parent its spans on the request's.
func TestObserver(t *testing.T) {
	type traceKey struct{}
	ctx := context.WithValue(context.Background(), traceKey{}, "trace-1")
	var mu sync.Mutex
	seen := map[cacheguard.EventKind]int{}
	untraced := 0
	g, _ := newGuard(t, cacheguard.Observer(func(ctx context.Context, e cacheguard.Event) {
		mu.Lock()
		seen[e.Kind]++
		if ctx.Value(traceKey{}) != "trace-1" {
			untraced++
		}
		mu.Unlock()
	}))
	key := testKey(t)
	for range 2 {
		if _, err := cacheguard.Get(ctx, g, key, (&counter{}).load); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if seen[cacheguard.EventMiss] != 1 || seen[cacheguard.EventLoad] != 1 || seen[cacheguard.EventHit] != 1 {
		t.Fatalf("events %v", seen)
	}
	if untraced != 0 {
		t.Fatalf("%d events without the call's context values", untraced)
	}
}

// Warnings go to the Guard's Logger, each kind at most once a second.
func TestLoggerWarnsOncePerKind(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	var buf syncBuffer
	g := cacheguard.New(rdb, cacheguard.Logger(slog.New(slog.NewTextHandler(&buf, nil))))
	defer g.Close()
	s.Kill()
	for i := range 3 {
		if _, err := cacheguard.Get(ctx, g, testKey(t, fmt.Sprint(i)), (&counter{}).load); err != nil {
			t.Fatal(err)
		}
	}
	out := buf.String()
	if n := strings.Count(out, "fail-open"); n != 1 {
		t.Fatalf("%d fail-open warnings for 3 fail-open loads within a second, want 1:\n%s", n, out)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestDeclinedLoadIsNotAFailedLoad (issue 31, item 5): a loader that declines
// to load (an error matching ErrClosed: its process is closing, or ginmw's
// settle step only waiting for a fill) has not loaded: no EventLoad, not
// counted in Stats.Loads — for Get and GetMany.
func TestDeclinedLoadIsNotAFailedLoad(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var loads []cacheguard.Event
	g, _ := newGuard(t, cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
		if e.Kind == cacheguard.EventLoad {
			mu.Lock()
			loads = append(loads, e)
			mu.Unlock()
		}
	}))
	declined := fmt.Errorf("only waiting: %w", cacheguard.ErrClosed)
	if _, err := cacheguard.Get(ctx, g, testKey(t), func(context.Context) (item, error) { return item{}, declined }); !errors.Is(err, cacheguard.ErrClosed) {
		t.Fatalf("Get: %v, want the loader's ErrClosed", err)
	}
	key := testKey(t, "many")
	if _, err := cacheguard.GetMany(ctx, g, []string{key}, func(context.Context, []string) (map[string]item, error) { return nil, declined }); !errors.Is(err, cacheguard.ErrClosed) {
		t.Fatalf("GetMany: %v, want the loader's ErrClosed", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if n := g.Stats().Loads; n != 0 || len(loads) != 0 {
		t.Fatalf("Stats.Loads %d, load events %+v: a declined load counted as a (failed) load", n, loads)
	}
}

// Without Logger, warnings go to slog.Default(); Logger(nil) is the same.
func TestWarningsGoToSlogDefault(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.MaxRetries = -1 })
	def := logtest.New(8)
	def.Default(t)
	g := cacheguard.New(rdb, cacheguard.Logger(nil))
	defer g.Close()
	s.Kill()
	if _, err := cacheguard.Get(ctx, g, testKey(t, "k"), (&counter{}).load); err != nil {
		t.Fatal(err)
	}
	if m := def.Wait(t, 5*time.Second); !strings.HasPrefix(m, "cacheguard: ") {
		t.Fatalf("warning %q, want the Guard's", m)
	}
}
