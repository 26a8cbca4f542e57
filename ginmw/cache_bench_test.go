package ginmw_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// benchBody is a typical small JSON answer.
var benchBody = `{"id":1,"name":"cacheguard","owner":"cacheguard","description":"` + strings.Repeat("x", 160) + `"}`

// BenchmarkCacheWarm measures hits on a cached route.
func BenchmarkCacheWarm(b *testing.B) {
	s := redistest.Start(b)
	g := cacheguard.New(s.Client())
	defer g.Close()
	r := gin.New()
	r.GET("/repos/:id", ginmw.Cache(g, time.Hour), func(c *gin.Context) {
		c.Data(http.StatusOK, "application/json; charset=utf-8", []byte(benchBody))
	})
	if w := serve(r, http.MethodGet, "/repos/1"); w.Header().Get("X-Cache") != "MISS" {
		b.Fatalf("warming: %q", w.Header().Get("X-Cache"))
	}
	benchWarm(b, s, r, "HIT")
}

// BenchmarkCacheRawBaseline is BenchmarkCacheWarm's route as a handler that
// GETs the cached bytes from Redis and writes them.
func BenchmarkCacheRawBaseline(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Client()
	if err := rdb.Set(context.Background(), "raw:repos:1", benchBody, time.Hour).Err(); err != nil {
		b.Fatal(err)
	}
	r := gin.New()
	r.GET("/repos/:id", func(c *gin.Context) {
		v, err := rdb.Get(c.Request.Context(), "raw:repos:"+c.Param("id")).Bytes()
		if err != nil {
			c.AbortWithStatus(http.StatusServiceUnavailable)
			return
		}
		c.Header("X-Cache", "HIT")
		c.Data(http.StatusOK, "application/json; charset=utf-8", v)
	})
	benchWarm(b, s, r, "HIT")
}

func benchWarm(b *testing.B, s *redistest.Server, h http.Handler, xcache string) {
	b.SetParallelism(benchParallelism)
	b.ReportAllocs()
	cpu := startCPU(b, s)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/repos/1", nil))
			if w.Code != http.StatusOK || w.Body.Len() != len(benchBody) || w.Header().Get("X-Cache") != xcache {
				b.Errorf("status %d, %d bytes, X-Cache %q", w.Code, w.Body.Len(), w.Header().Get("X-Cache"))
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	cpu.report(b)
}
