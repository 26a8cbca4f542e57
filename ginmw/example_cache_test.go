package ginmw_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
)

func ExampleCache() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	g := cacheguard.New(rdb)
	defer g.Close()
	g.Invalidate(context.Background(), "repos:42") // start cold

	r := gin.New()
	// The entry is named like the row: gormplugin's invalidate-after-commit
	// and InvalidateAfter on the write route both drop "repos:42".
	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo)), func(c *gin.Context) {
		c.JSON(200, gin.H{"id": c.Param("id"), "name": "cacheguard"})
	})
	r.PUT("/repos/:id", ginmw.InvalidateAfter(g, repo), func(c *gin.Context) { c.Status(204) })

	for _, method := range []string{"GET", "GET", "PUT", "GET"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(method, "/repos/42", nil))
		if method == "GET" {
			fmt.Println(method, w.Code, w.Header().Get("X-Cache"), w.Body)
		} else {
			fmt.Println(method, w.Code)
		}
	}
	// Output:
	// GET 200 MISS {"id":"42","name":"cacheguard"}
	// GET 200 HIT {"id":"42","name":"cacheguard"}
	// PUT 204
	// GET 200 MISS {"id":"42","name":"cacheguard"}
}
