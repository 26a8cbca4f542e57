package ginmw_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/locks"
)

func ExampleLock() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb)
	defer l.Close()

	r := gin.New()
	// PUT /repos/:id/settings and DELETE /repos/:id both lock "repos:<id>".
	repo := ginmw.Resource("repos", ginmw.Int(ginmw.Param("id")))
	r.PUT("/repos/:id/settings", ginmw.Lock(l, repo), func(c *gin.Context) {
		lk, _ := ginmw.LockFromContext(c.Request.Context())
		_, fenced := ginmw.Fence(c) // pass the token to the storage you write
		c.JSON(200, gin.H{"locked": lk.Name(), "fenced": fenced})
	})
	r.DELETE("/repos/:id", ginmw.Lock(l, repo), func(c *gin.Context) { c.Status(204) })

	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("PUT", "/repos/42/settings", nil))
	fmt.Println(w.Code, w.Body.String())
	// Output: 200 {"fenced":true,"locked":"repos:42"}
}

func ExampleLock_conflict() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rdb.Close()
	l := locks.New(rdb)
	defer l.Close()

	// Someone else is editing repository 7.
	holder, _ := l.TryLock(context.Background(), "repos:7")
	defer holder.Unlock(context.Background())

	r := gin.New()
	r.PUT("/repos/:id/settings", ginmw.Lock(l, ginmw.Resource("repos", ginmw.Int(ginmw.Param("id"))), ginmw.LockOptions(locks.WaitBudget(0))),
		func(c *gin.Context) { c.Status(204) })
	w := httptest.NewRecorder()
	r.ServeHTTP(w, httptest.NewRequest("PUT", "/repos/7/settings", nil))
	fmt.Println(w.Code, "Retry-After:", w.Header().Get("Retry-After"))
	fmt.Println(w.Body.String())
	// Output:
	// 409 Retry-After: 10
	// {"error":"resource locked","resource":"repos:7","retry_after":10}
}
