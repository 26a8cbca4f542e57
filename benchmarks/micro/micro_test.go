// Package micro holds the Go micro-benchmarks of the hot paths, side by side
// with the peers (`go test -bench . -benchmem -count 5 ./micro/`; compare
// runs with benchstat). They use the server in CGBENCH_REDIS, or start one.
package micro

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/cacheguard/cacheguard/benchmarks/internal/redisproc"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
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
