package ginmw_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// benchParallelism is goroutines per GOMAXPROCS in the request benchmarks, so
// that requests overlap their Redis round trips as a server's would.
const benchParallelism = 8

func noContent(c *gin.Context) { c.Status(http.StatusNoContent) }

// BenchmarkLock measures requests through Lock, each on a resource of its own.
func BenchmarkLock(b *testing.B) {
	s := redistest.Start(b)
	l := locks.New(s.Client())
	defer l.Close()
	r := gin.New()
	r.PUT("/repos/:id/settings", ginmw.Lock(l, repoKey), noContent)
	benchDistinct(b, s, r)
}

// BenchmarkLockRawBaseline is BenchmarkLock's route guarded by a hand-written
// lock: SET NX PX to take it, a compare-and-delete script (EVALSHA) to release.
func BenchmarkLockRawBaseline(b *testing.B) {
	s := redistest.Start(b)
	r := gin.New()
	r.PUT("/repos/:id/settings", rawLock(s.Client()), noContent)
	benchDistinct(b, s, r)
}

var rawRelease = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func rawLock(rdb redis.UniversalClient) gin.HandlerFunc {
	return func(c *gin.Context) {
		ctx := c.Request.Context()
		key := "raw:lock:{repos:" + c.Param("id") + "}"
		token := locks.NewOwnerID()
		if err := rdb.Do(ctx, "SET", key, token, "NX", "PX", 10000).Err(); err != nil {
			if err == redis.Nil {
				c.AbortWithStatus(http.StatusConflict)
			} else {
				c.AbortWithStatus(http.StatusServiceUnavailable)
			}
			return
		}
		defer rawRelease.Run(context.WithoutCancel(ctx), rdb, []string{key}, token)
		c.Next()
	}
}

func benchDistinct(b *testing.B, s *redistest.Server, h http.Handler) {
	var next atomic.Int64
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	cpu := startCPU(b, s)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			target := "/repos/" + strconv.FormatInt(next.Add(1), 10) + "/settings"
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodPut, target, nil))
			if w.Code != http.StatusNoContent {
				b.Errorf("status %d", w.Code)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	cpu.report(b)
}
