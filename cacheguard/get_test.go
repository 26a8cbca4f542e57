package cacheguard_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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
