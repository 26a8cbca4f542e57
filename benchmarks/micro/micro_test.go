// Package micro holds the Go micro-benchmarks of the hot paths, side by side
// with the peers (`go test -bench . -benchmem -count 5 ./micro/`; compare
// runs with benchstat). They use the server in CGBENCH_REDIS, or start one.
package micro

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/benchmarks/internal/redisproc"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
	"github.com/cacheguard/cacheguard/cacheguard"
)

var addr string

func TestMain(m *testing.M) {
	addr = os.Getenv("CGBENCH_REDIS")
	if addr == "" {
		srv, err := redisproc.Start()
		if err != nil {
			fmt.Fprintln(os.Stderr, "SKIP:", err)
			if os.Getenv("CACHEGUARD_REQUIRE_REDIS") == "1" {
				os.Exit(1)
			}
			os.Exit(0)
		}
		addr = srv.Addr()
		code := m.Run()
		srv.Close()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// short names for sub-benchmarks (benchstat keys).
var short = map[string]string{
	systems.Locks:        "locks",
	systems.Redsync:      "redsync",
	systems.BSM:          "bsm",
	systems.Rueidislock:  "rueidislock",
	systems.RawSetNX:     "raw",
	systems.Guard:        "cacheguard",
	systems.GuardHandOff: "cacheguard-handoff",
	systems.RawGetDecode: "raw",
	systems.GoRedisGet:   "gorediscache",
}

var seq atomic.Int64

func unique(prefix string) string {
	return prefix + ":" + strconv.FormatInt(seq.Add(1), 10) + ":" + strconv.Itoa(os.Getpid())
}

var mutexes = []string{systems.Locks, systems.Redsync, systems.BSM, systems.Rueidislock, systems.RawSetNX}

func newMutex(b *testing.B, name string) systems.Mutex {
	b.Helper()
	if err := systems.Available(name); err != nil {
		b.Skip(err)
	}
	m, err := systems.NewMutex(name, systems.MutexConfig{Addrs: []string{addr}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkLockUnlock is one uncontended Lock + Unlock, one goroutine.
func BenchmarkLockUnlock(b *testing.B) {
	for _, name := range mutexes {
		b.Run(short[name], func(b *testing.B) {
			m := newMutex(b, name)
			ctx := context.Background()
			key := unique("micro:cycle")
			b.ReportAllocs()
			for b.Loop() {
				h, err := m.Acquire(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLockUnlockParallel is uncontended Lock + Unlock from GOMAXPROCS
// goroutines, each on its own name.
func BenchmarkLockUnlockParallel(b *testing.B) {
	for _, name := range mutexes {
		b.Run(short[name], func(b *testing.B) {
			m := newMutex(b, name)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(4)
			b.RunParallel(func(pb *testing.PB) {
				key := unique("micro:pcycle")
				for pb.Next() {
					h, err := m.Acquire(ctx, key)
					if err != nil {
						b.Error(err)
						return
					}
					if err := h.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

var caches = []string{systems.Guard, systems.GuardHandOff, systems.RawGetDecode, systems.GoRedisGet}

// BenchmarkWarmGet is one read of a warm key, one goroutine.
func BenchmarkWarmGet(b *testing.B) {
	for _, name := range caches {
		b.Run(short[name], func(b *testing.B) {
			if err := systems.Available(name); err != nil {
				b.Skip(err)
			}
			c, err := systems.NewCache(name, systems.CacheConfig{Addr: addr})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			key := unique("micro:warm")
			loads := 0
			load := func(context.Context) (systems.Repo, error) { loads++; return systems.SampleRepo(1), nil }
			if _, err := c.Get(ctx, key, load); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Get(ctx, key, load); err != nil {
					b.Fatal(err)
				}
			}
			if loads != 1 {
				b.Fatalf("%d loads on a warm key, want 1 (the fill)", loads)
			}
		})
	}
}

// BenchmarkWarmGetMany reads 100 warm keys: with one cacheguard.GetMany
// (many) and with 100 cacheguard.Gets in a row (sequential), one goroutine —
// of a small record (an id and a name, as cacheguard's own
// BenchmarkGetMany100) and of the 300-byte Repo of the other scenarios, whose
// decoding (the same in both ways) takes most of a batch's time.
func BenchmarkWarmGetMany(b *testing.B) {
	b.Run("small", func(b *testing.B) { benchWarmGetMany(b, func() small { return small{ID: 42, Name: "cacheguard"} }) })
	b.Run("repo", func(b *testing.B) { benchWarmGetMany(b, func() systems.Repo { return systems.SampleRepo(1) }) })
}

type small struct {
	ID   int    `json:"id"`
	Name string `json:"name"`
}

func benchWarmGetMany[T any](b *testing.B, value func() T) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer g.Close()
	ctx := context.Background()
	keys := make([]string, 100)
	for i := range keys {
		keys[i] = unique("micro:many")
	}
	var loads atomic.Int64
	loadMany := func(_ context.Context, ks []string) (map[string]T, error) {
		loads.Add(1)
		m := make(map[string]T, len(ks))
		for _, k := range ks {
			m[k] = value()
		}
		return m, nil
	}
	load := func(context.Context) (T, error) { loads.Add(1); return value(), nil }
	if _, err := cacheguard.GetMany(ctx, g, keys, loadMany); err != nil {
		b.Fatal(err)
	}
	b.Run("many", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if m, err := cacheguard.GetMany(ctx, g, keys, loadMany); err != nil || len(m) != len(keys) {
				b.Fatal(len(m), err)
			}
		}
	})
	b.Run("sequential", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, k := range keys {
				if _, err := cacheguard.Get(ctx, g, k, load); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
	if n := loads.Load(); n != 1 {
		b.Fatalf("%d loads of warm keys, want 1 (the fill)", n)
	}
}

// BenchmarkDecode decodes a warm hit's value, one goroutine, with
// cacheguard's default codec (cacheguard.JSON) and with encoding/json: the
// small record and the 300-byte Repo. Their ratio, measured in one run, does
// not depend on the host's speed; it would fall if the default codec's
// decoder paid a cost of some hosts only, as segmentio/asm's AVX→SSE
// transitions did (0.17–0.4 µs a call on the hosts measured).
func BenchmarkDecode(b *testing.B) {
	b.Run("small", func(b *testing.B) { benchDecode(b, small{ID: 42, Name: "cacheguard"}) })
	b.Run("repo", func(b *testing.B) { benchDecode(b, systems.SampleRepo(1)) })
}

func benchDecode[T any](b *testing.B, v T) {
	data, err := json.Marshal(v)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name      string
		unmarshal func([]byte, any) error
	}{{"cacheguard", cacheguard.JSON{}.Unmarshal}, {"std", json.Unmarshal}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var out T
				if err := c.unmarshal(data, &out); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
