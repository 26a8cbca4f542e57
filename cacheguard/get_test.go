package cacheguard_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

func TestGetMissThenHit(t *testing.T) {
	ctx := context.Background()
	g, rdb := newGuard(t)
	key := testKey(t)
	c := &counter{name: "a"}
	var res cacheguard.Result
	v, err := cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res))
	if err != nil || v != (item{1, "a"}) || res != cacheguard.Miss {
		t.Fatalf("first Get = %v, %v, %v; want {1 a}, nil, MISS", v, err, res)
	}
	v, err = cacheguard.Get(ctx, g, key, c.load, cacheguard.ReportTo(&res))
	if err != nil || v != (item{1, "a"}) || res != cacheguard.Hit {
		t.Fatalf("second Get = %v, %v, %v; want {1 a}, nil, HIT", v, err, res)
	}
	if n := c.n.Load(); n != 1 {
		t.Fatalf("loads = %d, want 1", n)
	}
	if ttl := rdb.PTTL(ctx, valueKey(key)).Val(); ttl <= 110*time.Second || ttl > 120*time.Second {
		t.Fatalf("value TTL %v, want the default minute less at most 10%% jitter, and a minute of late window (see lateFor)", ttl)
	}
	if n := rdb.Exists(ctx, leaseKey(key)).Val(); n != 0 {
		t.Fatal("fill lease left behind")
	}
	st := g.Stats()
	if st.Hits != 1 || st.Misses != 1 || st.Loads != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestBadInputBeforeRedis(t *testing.T) {
	ctx := context.Background()
	rdb := shared(t)
	cmds := &redistest.CommandCounter{}
	rdb.AddHook(cmds)
	g := cacheguard.New(rdb)
	defer g.Close()
	load := (&counter{}).load
	cases := []struct {
		name string
		g    *cacheguard.Guard
		key  string
		load func(context.Context) (item, error)
		opts []cacheguard.CallOption
	}{
		{"nil guard", nil, "k", load, nil},
		{"empty key", g, "", load, nil},
		{"oversize key", g, strings.Repeat("k", cacheguard.MaxKeyLen+1), load, nil},
		{"nil loader", g, "k", nil, nil},
		{"negative TTL", g, "k", load, []cacheguard.CallOption{cacheguard.TTL(-time.Second)}},
		{"zero TTL", g, "k", load, []cacheguard.CallOption{cacheguard.TTL(0)}},
		{"negative stale window", g, "k", load, []cacheguard.CallOption{cacheguard.ServeStale(-time.Second)}},
		{"negative stale grace", g, "k", load, []cacheguard.CallOption{cacheguard.StaleGrace(-time.Second)}},
		{"negative negative TTL", g, "k", load, []cacheguard.CallOption{cacheguard.NegativeTTL(-time.Second)}},
		{"negative wait", g, "k", load, []cacheguard.CallOption{cacheguard.WaitBudget(-time.Second)}},
		{"jitter 1", g, "k", load, []cacheguard.CallOption{cacheguard.Jitter(1)}},
		{"negative beta", g, "k", load, []cacheguard.CallOption{cacheguard.EarlyRefresh(-1)}},
		{"short fill lease", g, "k", load, []cacheguard.CallOption{cacheguard.Lease(time.Millisecond)}},
		{"nil codec", g, "k", load, []cacheguard.CallOption{cacheguard.Encoding(nil)}},
	}
	for _, tc := range cases {
		_, err := cacheguard.Get(ctx, tc.g, tc.key, tc.load, tc.opts...)
		if !errors.Is(err, cacheguard.ErrInvalid) {
			t.Errorf("%s: err = %v, want ErrInvalid", tc.name, err)
		}
	}
	if err := g.Invalidate(ctx, ""); !errors.Is(err, cacheguard.ErrInvalid) {
		t.Errorf("Invalidate(\"\") = %v, want ErrInvalid", err)
	}
	var nilGuard *cacheguard.Guard
	if err := nilGuard.Invalidate(ctx, "k"); !errors.Is(err, cacheguard.ErrInvalid) {
		t.Errorf("nil Guard Invalidate = %v, want ErrInvalid", err)
	}
	if n := cmds.Count(); n != 0 {
		t.Fatalf("%d Redis commands sent for bad input", n)
	}
	defer func() {
		if p := recover(); p == nil || !strings.HasPrefix(p.(string), "cacheguard: ") {
			t.Fatalf("New(nil) panicked with %v", p)
		}
	}()
	cacheguard.New(nil)
}

func TestClosedGuard(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t)
	g.Close()
	if _, err := cacheguard.Get(ctx, g, testKey(t), (&counter{}).load); !errors.Is(err, cacheguard.ErrClosed) {
		t.Fatalf("Get after Close = %v, want ErrClosed", err)
	}
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
}

// A warm hit allocates no more than a plain GET of the same bytes and their
// decode by the same codec: the call, its configuration and its key's part
// stay on the caller's stack, and go to the heap only on the paths that wait
// (see call.detach). A count, not a timing: it holds on any host. Before,
// a call waiting for its process's fill handed its part to the wait-budget
// path by address, which moved both to the heap for every Get (11 objects
// per hit against the plain GET's 10).
func TestWarmHitAllocatesNoMoreThanPlainGet(t *testing.T) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	t.Cleanup(func() { g.Close() })
	key := testKey(t)
	want := Repo{ID: 42, Name: "cacheguard"}
	load := func(context.Context) (Repo, error) { return want, nil }
	if _, err := cacheguard.Get(ctx, g, key, load); err != nil {
		t.Fatal(err)
	}
	raw, err := cacheguard.JSON{}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Set(ctx, key+":plain", raw, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	var failed atomic.Bool
	hit := testing.AllocsPerRun(200, func() {
		if v, err := cacheguard.Get(ctx, g, key, load); err != nil || v != want {
			failed.Store(true)
		}
	})
	plain := testing.AllocsPerRun(200, func() {
		b, err := rdb.Get(ctx, key+":plain").Bytes()
		var v Repo
		if err != nil || (cacheguard.JSON{}).Unmarshal(b, &v) != nil || v != want {
			failed.Store(true)
		}
	})
	if failed.Load() {
		t.Fatal("a Get or a plain GET failed")
	}
	if st := g.Stats(); st.Loads != 1 || st.Hits < 200 {
		t.Fatalf("not warm hits: %+v", st)
	}
	if hit > plain {
		t.Fatalf("a warm hit allocates %.0f objects, a plain GET and decode %.0f", hit, plain)
	}
}
