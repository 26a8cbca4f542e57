package locks_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/locks"
)

var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkCycle is one uncontended acquire+release per op, 16 goroutines
// (run with -cpu 1 so b.RunParallel starts 16), each on its own names.
func BenchmarkCycle(b *testing.B) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 32})
	defer rdb.Close()
	c := locks.New(rdb)
	defer c.Close()
	var id atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		name := "bench:" + strconv.FormatInt(id.Add(1), 10)
		for pb.Next() {
			lk, err := c.TryLock(ctx, name)
			if err != nil {
				b.Error(err)
				return
			}
			if err := lk.Unlock(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCycleRaw is the floor: SET NX PX and a compare-and-delete EVALSHA.
func BenchmarkCycleRaw(b *testing.B) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 32})
	defer rdb.Close()
	var id atomic.Int64
	b.SetParallelism(16)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		name := "raw:" + strconv.FormatInt(id.Add(1), 10)
		for pb.Next() {
			ok, err := rdb.SetNX(ctx, name, "tok", 10*time.Second).Result()
			if err != nil || !ok {
				b.Error("raw lock not obtained", err)
				return
			}
			if err := rawRelease.Run(ctx, rdb, []string{name}, "tok").Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
