package ginmw_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/childproc"
)

// TestCacheReadYourWritesAcrossProcesses is issue 14 item 1 through
// ginmw.Cache, process B a real child process: A's first GET runs a handler
// that reads version 1 and stalls; B commits 2, invalidates, and its GET
// stores 2; A reads 2; B commits 3 and invalidates. A GET on A that starts
// after both invalidations returned must answer 3 or later.
func TestCacheReadYourWritesAcrossProcesses(t *testing.T) {
	rdb, key := newRow(t)
	b := startChild(t, "service", key)
	g := cacheguard.New(redis.NewClient(&redis.Options{Addr: redisAddr}))
	t.Cleanup(func() { g.Close() })

	read := versionHandler(rdb, key)
	var stalled atomic.Bool
	entered, release := make(chan struct{}), make(chan struct{})
	r := newEngine()
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(ginmw.Resource("repos", ginmw.Param("id")))), func(c *gin.Context) {
		if stalled.CompareAndSwap(false, true) {
			v, _ := rdb.Get(c.Request.Context(), dbKey(key)).Result()
			close(entered)
			<-release
			c.String(http.StatusOK, v)
			return
		}
		read(c)
	})
	first := make(chan string, 1)
	go func() { first <- serve(r, http.MethodGet, "/repos/"+key).Body.String() }()
	<-entered // A's handler read version 1 and stalls
	released := false
	defer func() {
		if !released {
			close(release)
		}
		<-first
	}()

	ask(t, b, "write") // version 2, invalidated
	if got := ask(t, b, "get"); got != "got 2" {
		t.Fatalf("B: %q, want got 2", got)
	}
	if w := serve(r, http.MethodGet, "/repos/"+key); w.Body.String() != "2" {
		t.Fatalf("A after B's fill: %q (X-Cache %s), want version 2", w.Body, w.Header().Get("X-Cache"))
	}
	ask(t, b, "write") // version 3, invalidated

	misses := g.Stats().Misses
	third := make(chan *httptest.ResponseRecorder, 1)
	go func() { third <- serve(r, http.MethodGet, "/repos/"+key) }()
	eventually(t, 10*time.Second, "the third GET to miss", func() bool { return g.Stats().Misses > misses || len(third) > 0 })
	var w *httptest.ResponseRecorder
	select {
	case w = <-third:
	case <-time.After(time.Second):
		// Still waiting: it joined the stalled load. Let that load end to
		// see what it answers.
		released = true
		close(release)
		w = <-third
	}
	if v, _ := strconv.Atoi(w.Body.String()); w.Code != http.StatusOK || v < 3 {
		t.Fatalf("A's GET after both invalidations returned: %d %q (X-Cache %s); want version 3 or later (A had served 2)", w.Code, w.Body, w.Header().Get("X-Cache"))
	}
}

// A request to a route cached with CacheTags reads before it waits (its tags'
// versions), so it joins a fill of its entry already running in its process.
// When a write invalidates the entry while that fill's handler stalls — in
// this process, or in another (a real child process: a renewal of the fill's
// lease finds it void) — the request answers from a load begun after the
// write, as a request arriving then would, instead of waiting for the
// stalled handler (before: until its wait budget, 10 s).
func TestCacheTaggedRequestLeavesAStalledFill(t *testing.T) {
	for _, writer := range []string{"this process", "another process"} {
		t.Run(writer, func(t *testing.T) {
			rdb, key := newRow(t)
			g := cacheguard.New(redis.NewClient(&redis.Options{Addr: redisAddr}))
			t.Cleanup(func() { g.Close() })
			read := versionHandler(rdb, key)
			var stalled atomic.Bool
			entered, release := make(chan struct{}), make(chan struct{})
			repo := ginmw.Resource("repos", ginmw.Param("id"))
			r := newEngine()
			r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo), ginmw.CacheTags("detail")), func(c *gin.Context) {
				if stalled.CompareAndSwap(false, true) {
					close(entered)
					<-release
				}
				read(c)
			})
			r.PUT("/repos/:id", ginmw.InvalidateAfter(g, repo), func(c *gin.Context) {
				rdb.Incr(c.Request.Context(), dbKey(key))
				c.Status(http.StatusNoContent)
			})
			var b *childproc.Proc
			if writer == "another process" {
				b = startChild(t, "service", key)
			}
			first := make(chan *httptest.ResponseRecorder, 1)
			go func() { first <- serve(r, http.MethodGet, "/repos/"+key) }()
			<-entered // the fill's handler stalls
			defer func() { close(release); <-first }()
			misses := g.Stats().Misses
			second := make(chan *httptest.ResponseRecorder, 1)
			go func() { second <- serve(r, http.MethodGet, "/repos/"+key) }()
			eventually(t, 10*time.Second, "the second GET waiting for the fill", func() bool { return g.Stats().Misses > misses })
			if b != nil {
				ask(t, b, "write") // version 2, invalidated
			} else if w := serve(r, http.MethodPut, "/repos/"+key); w.Code != http.StatusNoContent {
				t.Fatalf("PUT: %d", w.Code)
			}
			select {
			case w := <-second:
				if w.Code != http.StatusOK || w.Body.String() != "2" {
					t.Fatalf("the second GET answered %d %q (X-Cache %s); want version 2", w.Code, w.Body, w.Header().Get("X-Cache"))
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the second GET still waits for the stalled handler 5s after the write's invalidation returned")
			}
		})
	}
}
