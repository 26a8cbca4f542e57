package ginmw_test

import (
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// A BackgroundRefresh copy is a request of its own: behind a Lock placed
// before Cache it takes the lock as its own owner, and waits for the request
// that started the refresh while that one still holds it (here in middleware
// that works after Cache returned). On the code before, the copy carried
// that request's owner (locks.WithOwner) and re-entered its holding: its
// handler ran while the other still worked under the lock.
func TestRefreshCopyLocksAsItsOwnOwner(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client()
	gate := newScriptGate(t)
	gate.armed.Store(false) // armed once the entry is stale: it holds the refresh's lease
	rdb.AddHook(gate)
	g := cacheguard.New(rdb)
	t.Cleanup(func() { g.Close() })
	l, lrdb, _ := newLocker(t)

	const ttl = 200 * time.Millisecond
	var (
		loads      atomic.Int64
		overlapped atomic.Bool  // a handler ran while the stale request held the lock
		holding    atomic.Bool  // the stale request is in its after-Cache work, holding the lock
		staleOwner atomic.Value // string: the stale request's owner
		copyOwner  = make(chan string, 1)
		working    = make(chan struct{})
		finish     = make(chan struct{})
	)
	var finishOnce sync.Once
	end := func() { finishOnce.Do(func() { close(finish) }) }
	t.Cleanup(end)
	afterCache := func(c *gin.Context) {
		c.Next()
		if c.Writer.Header().Get("X-Cache") == "STALE" {
			o, _ := locks.OwnerFrom(c.Request.Context())
			staleOwner.Store(o)
			holding.Store(true)
			close(working)
			<-finish
			holding.Store(false)
		}
	}
	r := newEngine()
	r.GET("/repos/:id", ginmw.Lock(l, repoKey), afterCache,
		ginmw.Cache(g, ttl, ginmw.BackgroundRefresh(r),
			ginmw.CacheOptions(cacheguard.ServeStale(time.Minute), cacheguard.EarlyRefresh(0), cacheguard.Jitter(0))),
		func(c *gin.Context) {
			if holding.Load() {
				overlapped.Store(true)
			}
			if n := loads.Add(1); n > 1 {
				o, _ := locks.OwnerFrom(c.Request.Context())
				copyOwner <- o
			}
			c.String(http.StatusOK, "v%d", loads.Load())
		})

	if w := serve(r, http.MethodGet, "/repos/1"); w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("first GET: %d %s", w.Code, w.Header().Get("X-Cache"))
	}
	stored := time.Now()
	waitEntries(t, rdb, 1)
	eventually(t, 10*time.Second, "the entry to be stale (its TTL is the subject)", func() bool { return time.Since(stored) > ttl+50*time.Millisecond })

	gate.armed.Store(true)
	stale := make(chan string, 1)
	go func() {
		w := serve(r, http.MethodGet, "/repos/1")
		stale <- w.Header().Get("X-Cache") + " " + w.Body.String()
	}()
	within(t, 10*time.Second, gate.held, "the refresh's lease")
	within(t, 10*time.Second, working, "the stale request's work after Cache")
	gate.release() // the refresh asks now, its request gone from Cache: a copy runs the chain

	queue := "cg:q:{repos:1}"
	eventually(t, 10*time.Second, "the copy to wait for the lock, or to run", func() bool {
		n, _ := lrdb.ZCard(context.Background(), queue).Result()
		return n > 0 || loads.Load() > 1
	})
	if overlapped.Load() {
		t.Fatal("the refresh copy's handler ran while the stale request held the lock (it re-entered as that request's owner)")
	}
	end()
	if got := <-stale; got != "STALE v1" {
		t.Fatalf("stale request: %q", got)
	}
	select {
	case o := <-copyOwner:
		if o == "" || o == staleOwner.Load().(string) {
			t.Fatalf("the copy ran as owner %q, the stale request's was %q", o, staleOwner.Load())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the refresh copy's handler did not run once the lock was free")
	}
	eventually(t, 10*time.Second, "the refreshed entry", func() bool {
		return serve(r, http.MethodGet, "/repos/1").Body.String() == "v2"
	})
}
