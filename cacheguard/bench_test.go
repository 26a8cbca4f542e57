package cacheguard_test

import (
	"context"
	"encoding/json"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// BenchmarkGetHit measures the hit path; compare with BenchmarkRawGetJSON,
// a plain go-redis GET and JSON decode of the same value.
func BenchmarkGetHit(b *testing.B) { benchGetHit(b, &redis.Options{Addr: redisAddr}) }

// BenchmarkGetHitContextTimeout is BenchmarkGetHit with a client that bounds
// its socket calls by the context's deadline (ContextTimeoutEnabled), on which
// a Get reads on its own goroutine instead of handing the read over.
func BenchmarkGetHitContextTimeout(b *testing.B) {
	benchGetHit(b, &redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
}

func benchGetHit(b *testing.B, opt *redis.Options) {
	ctx := context.Background()
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer g.Close()
	key := testKey(b)
	load := func(context.Context) (Repo, error) { return Repo{ID: 42, Name: "cacheguard"}, nil }
	if _, err := cacheguard.Get(ctx, g, key, load); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer reportCPU(b)()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := cacheguard.Get(ctx, g, key, load); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	if st := g.Stats(); st.Loads != 1 {
		b.Fatalf("loads = %d during a hit benchmark", st.Loads)
	}
}

func BenchmarkRawGetJSON(b *testing.B) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	key := testKey(b)
	raw, _ := json.Marshal(Repo{ID: 42, Name: "cacheguard"})
	if err := rdb.Set(ctx, key, raw, time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	defer reportCPU(b)()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			bs, err := rdb.Get(ctx, key).Bytes()
			var r Repo
			if err == nil {
				err = json.Unmarshal(bs, &r)
			}
			if err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// reportCPU reports the benchmark process's CPU time per operation, which is
// steadier than wall time on a machine shared with other work (the network
// round trip dominates wall time and is the same for both benchmarks).
func reportCPU(b *testing.B) func() {
	var start syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &start)
	return func() {
		var end syscall.Rusage
		syscall.Getrusage(syscall.RUSAGE_SELF, &end)
		cpu := time.Duration(end.Utime.Nano() + end.Stime.Nano() - start.Utime.Nano() - start.Stime.Nano())
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}
