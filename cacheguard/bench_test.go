package cacheguard_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// BenchmarkGetHit measures the hit path; compare with BenchmarkRawGetJSON,
// a plain go-redis GET and JSON decode of the same value.
func BenchmarkGetHit(b *testing.B) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb, cacheguard.TTL(time.Hour), cacheguard.EarlyRefresh(0))
	defer g.Close()
	key := testKey(b)
	load := func(context.Context) (Repo, error) { return Repo{ID: 42, Name: "cacheguard"}, nil }
	if _, err := cacheguard.Get(ctx, g, key, load); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
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
