package cgotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/cgotel"
)

// benchHit reads one warm key from 16 goroutines (b.SetParallelism on 2
// cores: 8 per CPU), through Redis or the near cache, with or without the
// Adapter's observer (an SDK MeterProvider with a reader, as in production).
func benchHit(b *testing.B, near, observed bool) {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	opts := []cacheguard.Option{cacheguard.TTL(time.Hour)}
	if near {
		opts = append(opts, cacheguard.NearCache(1000, time.Minute))
	}
	if observed {
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		defer mp.Shutdown(context.Background())
		opts = append(opts, cacheguard.Observer(cgotel.New(cgotel.MeterProvider(mp)).CacheObserver()))
	}
	g := cacheguard.New(rdb, opts...)
	defer g.Close()
	ctx := context.Background()
	load := func(context.Context) (string, error) { return "value", nil }
	if _, err := cacheguard.Get(ctx, g, "bench", load); err != nil {
		b.Fatal(err)
	}
	if _, err := cacheguard.Get(ctx, g, "bench", load); err != nil { // fills the near cache
		b.Fatal(err)
	}
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := cacheguard.Get(ctx, g, "bench", load); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkHit(b *testing.B)             { benchHit(b, false, false) }
func BenchmarkHitObserved(b *testing.B)     { benchHit(b, false, true) }
func BenchmarkNearHit(b *testing.B)         { benchHit(b, true, false) }
func BenchmarkNearHitObserved(b *testing.B) { benchHit(b, true, true) }
