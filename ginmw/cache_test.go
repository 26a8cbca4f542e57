package ginmw_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// newGuard returns a Guard on a client of its own (a Guard with its own
// client behaves like another process), closed at cleanup.
func newGuard(t testing.TB, s *redistest.Server, opts ...cacheguard.Option) (*cacheguard.Guard, *redis.Client) {
	t.Helper()
	rdb := s.Client()
	g := cacheguard.New(rdb, opts...)
	t.Cleanup(func() { g.Close() })
	return g, rdb
}

// startGuard starts a redis-server of the test's own and a Guard on it.
func startGuard(t *testing.T) (*cacheguard.Guard, *redis.Client) {
	t.Helper()
	return newGuard(t, redistest.Start(t))
}

// waitEntries waits until Redis holds n cached entries: a request that ran
// the handler answers before the load's store and publish end, so a request
// right after it may still join that load (COALESCED) instead of hitting.
func waitEntries(t *testing.T, rdb *redis.Client, n int) {
	t.Helper()
	eventually(t, 10*time.Second, fmt.Sprintf("%d stored entries", n), func() bool {
		got, err := storedEntries(rdb)
		return err == nil && got == n
	})
}

// storedEntries counts the entries cached in rdb: the fields of every values
// hash (see cacheguard's "Keys").
func storedEntries(rdb *redis.Client) (int, error) {
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, "cg:v:*").Result()
	n := 0
	for _, k := range keys {
		l, herr := rdb.HLen(ctx, k).Result()
		err = errors.Join(err, herr)
		n += int(l)
	}
	return n, err
}

func totalMisses(gs ...*cacheguard.Guard) uint64 {
	var n uint64
	for _, g := range gs {
		n += g.Stats().Misses
	}
	return n
}

// 500 concurrent GETs on a cold route, spread over 4 engines with a Guard and
// a Redis client each (four processes, as far as Redis can tell): the handler
// runs once, and every request gets its response.
func TestCacheColdStampedeRunsHandlerOnce(t *testing.T) {
	s := redistest.Start(t)
	const engines, requests = 4, 500
	var calls atomic.Int64
	release := make(chan struct{})
	handler := func(c *gin.Context) {
		calls.Add(1)
		<-release // the database is slow: every request arrives meanwhile
		c.Header("X-Repo", c.Param("id"))
		c.JSON(http.StatusOK, gin.H{"id": c.Param("id"), "name": "cacheguard"})
	}
	guards := make([]*cacheguard.Guard, engines)
	routers := make([]*gin.Engine, engines)
	for i := range engines {
		guards[i], _ = newGuard(t, s)
		routers[i] = newEngine()
		routers[i].GET("/repos/:id", ginmw.Cache(guards[i], time.Minute), handler)
	}

	type result struct {
		code         int
		xcache, body string
		repo         string
	}
	results := make([]result, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() {
			w := serve(routers[i%engines], http.MethodGet, "/repos/42")
			results[i] = result{w.Code, w.Header().Get("X-Cache"), w.Body.String(), w.Header().Get("X-Repo")}
		})
	}
	// Every request has found the entry missing and waits for the one load.
	eventually(t, 30*time.Second, "all requests to miss", func() bool { return totalMisses(guards...) == requests })
	close(release)
	wg.Wait()

	wantCalls(t, &calls, 1)
	counts := map[string]int{}
	for i, r := range results {
		if r.code != http.StatusOK || r.body != `{"id":"42","name":"cacheguard"}` || r.repo != "42" {
			t.Fatalf("request %d: %+v", i, r)
		}
		counts[r.xcache]++
	}
	if counts["MISS"] != 1 || counts["COALESCED"] != requests-1 {
		t.Fatalf("X-Cache counts %v, want 1 MISS and the rest COALESCED", counts)
	}
	// Warm now: a hit on every engine, still without the handler.
	for _, r := range routers {
		if w := serve(r, http.MethodGet, "/repos/42"); w.Header().Get("X-Cache") != "HIT" || w.Body.String() != results[0].body {
			t.Fatalf("warm request: X-Cache %q body %q", w.Header().Get("X-Cache"), w.Body)
		}
	}
	wantCalls(t, &calls, 1)
}

// A hit replays the status, the headers and the body; the request's own
// headers from middleware before Cache are kept.
func TestCacheHitReplaysResponse(t *testing.T) {
	g, rdb := startGuard(t)
	var calls atomic.Int64
	r := newEngine()
	r.Use(func(c *gin.Context) { c.Header("X-Request-Id", c.Query("req")) })
	r.GET("/items", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		calls.Add(1)
		c.Header("Cache-Control", "public, max-age=60")
		c.Data(http.StatusAccepted, "text/plain; charset=utf-8", []byte("hello"))
	})
	first := serve(r, http.MethodGet, "/items?b=2&a=1&req=1")
	waitEntries(t, rdb, 1)
	second := serve(r, http.MethodGet, "/items?req=1&a=1&b=2") // same query, another order
	for i, w := range []*httptest.ResponseRecorder{first, second} {
		if w.Code != http.StatusAccepted || w.Body.String() != "hello" ||
			w.Header().Get("Content-Type") != "text/plain; charset=utf-8" ||
			w.Header().Get("Cache-Control") != "public, max-age=60" ||
			w.Header().Get("Content-Length") != "5" || w.Header().Get("X-Request-Id") != "1" {
			t.Fatalf("response %d: %d %q %v", i, w.Code, w.Body, w.Header())
		}
	}
	if first.Header().Get("X-Cache") != "MISS" || second.Header().Get("X-Cache") != "HIT" || calls.Load() != 1 {
		t.Fatalf("X-Cache %q then %q, handler ran %d times", first.Header().Get("X-Cache"), second.Header().Get("X-Cache"), calls.Load())
	}
	if w := serve(r, http.MethodGet, "/items?a=1&b=3"); w.Header().Get("X-Cache") != "MISS" || calls.Load() != 2 {
		t.Fatalf("another query was served from the cache: %q", w.Header().Get("X-Cache"))
	}
}

// Non-2xx responses and responses that set a cookie are not stored.
func TestCacheSkipsErrorsAndCookies(t *testing.T) {
	g, rdb := startGuard(t)
	var calls atomic.Int64
	r := newEngine()
	r.GET("/missing", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		calls.Add(1)
		c.JSON(http.StatusNotFound, gin.H{"error": "no such repo"})
	})
	r.GET("/cookie", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		calls.Add(1)
		c.SetCookie("session", "abc", 60, "/", "", false, true)
		c.String(http.StatusOK, "hi")
	})
	for _, target := range []string{"/missing", "/cookie"} {
		calls.Store(0)
		// A request right after an uncached load may still share that load's
		// answer (COALESCED, or BYPASS and its own handler when the answer set
		// a cookie); it is never stored, so MISS comes back.
		misses, bypasses := 0, 0
		eventually(t, 10*time.Second, "two answers from the handler", func() bool {
			switch serve(r, http.MethodGet, target).Header().Get("X-Cache") {
			case "MISS":
				misses++
			case "BYPASS":
				bypasses++
			}
			return misses == 2
		})
		if calls.Load() != int64(misses+bypasses) {
			t.Fatalf("%s: handler ran %d times for %d misses and %d bypasses", target, calls.Load(), misses, bypasses)
		}
	}
	if keys, _ := rdb.Keys(context.Background(), "cg:v:*").Result(); len(keys) != 0 {
		t.Fatalf("stored %v", keys)
	}
}

// Requests that wait for a load whose response sets a cookie never receive
// that cookie: each runs its own handler. An error page without a cookie is
// shared with them.
func TestCacheCoalescedCallersGetOwnCookies(t *testing.T) {
	g, _ := startGuard(t)
	const n = 10
	release := make(chan struct{})
	var first atomic.Bool
	r := newEngine()
	r.GET("/me", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		if first.CompareAndSwap(false, true) {
			<-release
		}
		c.SetCookie("user", c.GetHeader("X-User"), 60, "/", "", false, true)
		c.String(http.StatusOK, "hello "+c.GetHeader("X-User"))
	})
	codes := make([]*httptest.ResponseRecorder, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { codes[i] = serve(r, http.MethodGet, "/me", "X-User", fmt.Sprint("u", i)) })
	}
	eventually(t, 10*time.Second, "all requests to miss", func() bool { return totalMisses(g) == n })
	close(release)
	wg.Wait()
	xcache := map[string]int{}
	for i, w := range codes {
		want := fmt.Sprint("u", i)
		if got := w.Result().Cookies(); len(got) != 1 || got[0].Value != want || w.Body.String() != "hello "+want {
			t.Fatalf("request %d got cookies %v and body %q", i, got, w.Body)
		}
		xcache[w.Header().Get("X-Cache")]++
	}
	if xcache["MISS"] != 1 || xcache["BYPASS"] != n-1 {
		t.Fatalf("X-Cache counts %v, want 1 MISS and the rest BYPASS", xcache)
	}

	// An error page is shared with the requests that waited for it.
	var calls atomic.Int64
	release2 := make(chan struct{})
	r.GET("/broken", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		calls.Add(1)
		<-release2
		c.String(http.StatusBadGateway, "upstream down")
	})
	before := totalMisses(g)
	ws := make([]*httptest.ResponseRecorder, n)
	for i := range n {
		wg.Go(func() { ws[i] = serve(r, http.MethodGet, "/broken") })
	}
	eventually(t, 10*time.Second, "all requests to miss", func() bool { return totalMisses(g) == before+n })
	close(release2)
	wg.Wait()
	for i, w := range ws {
		if w.Code != http.StatusBadGateway || w.Body.String() != "upstream down" {
			t.Fatalf("request %d: %d %q", i, w.Code, w.Body)
		}
		xc := w.Header().Get("X-Cache")
		if xc != "MISS" && xc != "COALESCED" {
			t.Fatalf("request %d: X-Cache %q", i, xc)
		}
	}
	wantCalls(t, &calls, 1)
}

// A response to a request carrying Authorization is stored only when it says
// so (public, s-maxage, must-revalidate) or when Cache keys by Authorization;
// Range requests bypass the cache.
func TestCacheAuthorization(t *testing.T) {
	g, rdb := startGuard(t)
	var calls atomic.Int64
	r := newEngine()
	h := func(cc string) gin.HandlerFunc {
		return func(c *gin.Context) {
			calls.Add(1)
			if cc != "" {
				c.Header("Cache-Control", cc)
			}
			c.String(http.StatusOK, "for "+c.GetHeader("Authorization"))
		}
	}
	r.GET("/private", ginmw.Cache(g, time.Minute), h(""))
	r.GET("/public", ginmw.Cache(g, time.Minute), h("public"))
	r.GET("/keyed", ginmw.Cache(g, time.Minute, ginmw.VaryByHeader("Authorization")), h(""))
	for _, who := range []string{"Bearer a", "Bearer b"} {
		w := serve(r, http.MethodGet, "/private", "Authorization", who)
		if w.Header().Get("X-Cache") != "MISS" || w.Body.String() != "for "+who {
			t.Fatalf("/private for %s: X-Cache %q body %q", who, w.Header().Get("X-Cache"), w.Body)
		}
	}
	if n, err := storedEntries(rdb); err != nil || n != 0 {
		t.Fatalf("%d entries stored (%v), want none", n, err)
	}
	serve(r, http.MethodGet, "/public", "Authorization", "Bearer a")
	serve(r, http.MethodGet, "/keyed", "Authorization", "Bearer a")
	waitEntries(t, rdb, 2)
	if w := serve(r, http.MethodGet, "/public", "Authorization", "Bearer b"); w.Header().Get("X-Cache") != "HIT" || w.Body.String() != "for Bearer a" {
		t.Fatalf("/public: X-Cache %q body %q, want the stored public response", w.Header().Get("X-Cache"), w.Body)
	}
	if w := serve(r, http.MethodGet, "/keyed", "Authorization", "Bearer b"); w.Header().Get("X-Cache") != "MISS" || w.Body.String() != "for Bearer b" {
		t.Fatalf("/keyed for b: X-Cache %q body %q", w.Header().Get("X-Cache"), w.Body)
	}
	if w := serve(r, http.MethodGet, "/keyed", "Authorization", "Bearer a"); w.Header().Get("X-Cache") != "HIT" || w.Body.String() != "for Bearer a" {
		t.Fatalf("/keyed for a: X-Cache %q body %q", w.Header().Get("X-Cache"), w.Body)
	}
	if w := serve(r, http.MethodGet, "/public", "Range", "bytes=0-1"); w.Header().Get("X-Cache") != "BYPASS" {
		t.Fatalf("Range: X-Cache %q", w.Header().Get("X-Cache"))
	}
	wantCalls(t, &calls, 6)
}

// VaryByHeader keeps one entry per header value and says so in Vary; HEAD has
// its own entry.
func TestCacheVaryAndHead(t *testing.T) {
	g, rdb := startGuard(t)
	var calls atomic.Int64
	r := newEngine()
	h := func(c *gin.Context) {
		calls.Add(1)
		if c.Request.Method == http.MethodHead {
			c.Header("Content-Length", "5")
			c.Status(http.StatusOK)
			return
		}
		c.String(http.StatusOK, "lang="+c.GetHeader("Accept-Language"))
	}
	mw := ginmw.Cache(g, time.Minute, ginmw.VaryByHeader("accept-language"))
	r.GET("/greeting", mw, h)
	r.HEAD("/greeting", mw, h)
	for i, tc := range []struct{ lang, body, xcache string }{
		{"en", "lang=en", "MISS"}, {"fr", "lang=fr", "MISS"}, {"en", "lang=en", "HIT"}, {"fr", "lang=fr", "HIT"},
	} {
		w := serve(r, http.MethodGet, "/greeting", "Accept-Language", tc.lang)
		waitEntries(t, rdb, min(i+1, 2))
		if w.Body.String() != tc.body || w.Header().Get("X-Cache") != tc.xcache || w.Header().Get("Vary") != "Accept-Language" {
			t.Fatalf("request %d: %q %q Vary %q", i, w.Body, w.Header().Get("X-Cache"), w.Header().Get("Vary"))
		}
	}
	if w := serve(r, http.MethodHead, "/greeting", "Accept-Language", "en"); w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("HEAD served from GET's entry: %q", w.Header().Get("X-Cache"))
	}
	waitEntries(t, rdb, 3)
	if w := serve(r, http.MethodHead, "/greeting", "Accept-Language", "en"); w.Header().Get("X-Cache") != "HIT" || w.Body.Len() != 0 || w.Header().Get("Content-Length") != "5" {
		t.Fatalf("second HEAD: %q body %q Content-Length %q", w.Header().Get("X-Cache"), w.Body, w.Header().Get("Content-Length"))
	}
	wantCalls(t, &calls, 3)
}

// Invalidate and InvalidateAfter drop entries; the next GET loads afresh.
func TestCacheInvalidate(t *testing.T) {
	g, _ := startGuard(t)
	var version atomic.Int64
	r := newEngine()
	repo := ginmw.Resource("repos", ginmw.Param("id"))
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo)), func(c *gin.Context) {
		c.String(http.StatusOK, fmt.Sprint("v", version.Load()))
	})
	r.GET("/orgs/:id", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		c.String(http.StatusOK, fmt.Sprint("v", version.Load()))
	})
	r.PUT("/repos/:id", ginmw.InvalidateAfter(g, repo), func(c *gin.Context) {
		version.Add(1)
		c.Status(http.StatusNoContent)
	})
	get := func(target string) string { return serve(r, http.MethodGet, target).Body.String() }
	if get("/repos/1") != "v0" || get("/orgs/1") != "v0" {
		t.Fatal("first loads")
	}
	serve(r, http.MethodPut, "/repos/1")
	if got := get("/repos/1"); got != "v1" {
		t.Fatalf("after InvalidateAfter: %q, want v1", got)
	}
	if got := get("/orgs/1"); got != "v0" {
		t.Fatalf("/orgs/1 %q, want the cached v0", got)
	}
	if err := g.Invalidate(context.Background(), ginmw.PathKey("/orgs/1", nil)); err != nil {
		t.Fatal(err)
	}
	if got := get("/orgs/1"); got != "v1" {
		t.Fatalf("after Invalidate: %q, want v1", got)
	}
	if err := g.Invalidate(context.Background(), ""); err == nil {
		t.Fatal("empty key accepted")
	}
}

// A handler that panics under Cache reaches Gin's recovery; nothing is
// stored, and the next request runs the handler.
func TestCacheHandlerPanic(t *testing.T) {
	g, _ := startGuard(t)
	var calls atomic.Int64
	r := newEngine()
	r.GET("/p", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		if calls.Add(1) == 1 {
			panic("boom")
		}
		c.String(http.StatusOK, "ok")
	})
	if w := serve(r, http.MethodGet, "/p"); w.Code != http.StatusInternalServerError {
		t.Fatalf("status %d, want 500 from the recovery", w.Code)
	}
	// The next request runs the handler: as the load (MISS), or on its own
	// (BYPASS) if it joined the load that panicked.
	if w := serve(r, http.MethodGet, "/p"); w.Code != http.StatusOK || (w.Header().Get("X-Cache") != "MISS" && w.Header().Get("X-Cache") != "BYPASS") {
		t.Fatalf("next: %d %q", w.Code, w.Header().Get("X-Cache"))
	}
}

// Conditional requests are answered from the stored response; the handler
// sees an unconditional request.
func TestCacheConditional(t *testing.T) {
	g, rdb := startGuard(t)
	var sawINM atomic.Bool
	r := newEngine()
	r.GET("/doc", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		if c.GetHeader("If-None-Match") != "" {
			sawINM.Store(true)
		}
		c.Header("ETag", `"v1"`)
		c.String(http.StatusOK, "document")
	})
	if w := serve(r, http.MethodGet, "/doc", "If-None-Match", `"v1"`); w.Code != http.StatusNotModified || w.Body.Len() != 0 || w.Header().Get("ETag") != `"v1"` {
		t.Fatalf("first conditional request: %d %q %v", w.Code, w.Body, w.Header())
	}
	waitEntries(t, rdb, 1)
	if w := serve(r, http.MethodGet, "/doc"); w.Code != http.StatusOK || w.Body.String() != "document" || w.Header().Get("X-Cache") != "HIT" {
		t.Fatalf("plain request: %d %q %q", w.Code, w.Body, w.Header().Get("X-Cache"))
	}
	if w := serve(r, http.MethodGet, "/doc", "If-None-Match", `W/"v0", W/"v1"`); w.Code != http.StatusNotModified {
		t.Fatalf("weak match: %d", w.Code)
	}
	if sawINM.Load() {
		t.Fatal("the handler saw If-None-Match")
	}
}

// A response larger than MaxBody, or flushed, is streamed to its client and
// not stored.
func TestCacheStreamsLargeOrFlushedResponses(t *testing.T) {
	g, _ := startGuard(t)
	var calls atomic.Int64
	big := strings.Repeat("x", 100)
	r := newEngine()
	r.GET("/big", ginmw.Cache(g, time.Minute, ginmw.MaxBody(10)), func(c *gin.Context) {
		calls.Add(1)
		c.String(http.StatusOK, big)
	})
	r.GET("/stream", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		calls.Add(1)
		c.String(http.StatusOK, "part1,")
		c.Writer.Flush()
		c.String(http.StatusOK, "part2")
	})
	for range 2 {
		// MISS, or BYPASS when it joined the previous load (whose answer was streamed).
		if w := serve(r, http.MethodGet, "/big"); w.Body.String() != big || (w.Header().Get("X-Cache") != "MISS" && w.Header().Get("X-Cache") != "BYPASS") {
			t.Fatalf("big: %q %q", w.Body, w.Header().Get("X-Cache"))
		}
		if w := serve(r, http.MethodGet, "/stream"); w.Body.String() != "part1,part2" || !w.Flushed {
			t.Fatalf("stream: %q flushed %v", w.Body, w.Flushed)
		}
	}
	wantCalls(t, &calls, 4) // nothing cached
}

// Under ServeStale with BackgroundRefresh, an expired entry is served stale
// at once and refreshed in the background through the engine.
func TestCacheServeStaleRefreshesInBackground(t *testing.T) {
	g, _ := startGuard(t)
	var version atomic.Int64
	r := newEngine()
	r.GET("/repos/:id", ginmw.Cache(g, 100*time.Millisecond,
		ginmw.CacheOptions(cacheguard.ServeStale(time.Minute), cacheguard.Jitter(0), cacheguard.EarlyRefresh(0)),
		ginmw.BackgroundRefresh(r)),
		func(c *gin.Context) { c.String(http.StatusOK, fmt.Sprint("v", version.Add(1))) })
	if w := serve(r, http.MethodGet, "/repos/1"); w.Body.String() != "v1" || w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("first: %q %q", w.Body, w.Header().Get("X-Cache"))
	}
	// Once the entry is past its TTL it is served stale, at once...
	var stale string
	eventually(t, 10*time.Second, "a stale answer", func() bool {
		w := serve(r, http.MethodGet, "/repos/1")
		if w.Header().Get("X-Cache") == "STALE" {
			stale = w.Body.String()
		}
		return stale != ""
	})
	// ...while a background refresh, through the engine, stores the next version.
	eventually(t, 10*time.Second, "the refreshed value", func() bool {
		w := serve(r, http.MethodGet, "/repos/1")
		if w.Header().Get("X-Cache") == "MISS" {
			t.Fatalf("a request loaded in the foreground: %q", w.Body)
		}
		return w.Body.String() != stale
	})
}

// With Redis down, Cache fails open by default: the handler runs, uncached.
func TestCacheRedisDownFailsOpen(t *testing.T) {
	s := redistest.Start(t)
	g := cacheguard.New(s.Client(func(o *redis.Options) { o.MaxRetries = -1 }))
	t.Cleanup(func() { g.Close() })
	var calls atomic.Int64
	r := newEngine()
	r.GET("/x", ginmw.Cache(g, time.Minute), func(c *gin.Context) { calls.Add(1); c.String(http.StatusOK, "fresh") })
	s.Kill()
	for range 2 {
		if w := serve(r, http.MethodGet, "/x"); w.Code != http.StatusOK || w.Body.String() != "fresh" {
			t.Fatalf("%d %q", w.Code, w.Body)
		}
	}
	wantCalls(t, &calls, 2)
}

// Other methods pass through untouched.
func TestCacheOtherMethodsPassThrough(t *testing.T) {
	g, _ := startGuard(t)
	r := newEngine()
	r.POST("/x", ginmw.Cache(g, time.Minute), func(c *gin.Context) { c.String(http.StatusCreated, "made") })
	if w := serve(r, http.MethodPost, "/x"); w.Code != http.StatusCreated || w.Header().Get("X-Cache") != "" {
		t.Fatalf("%d %q", w.Code, w.Header().Get("X-Cache"))
	}
}

// Under FailFast a miss is answered at once with 503 and Retry-After while the
// entry fills in the background through the engine; without BackgroundRefresh
// the request is served directly instead (nothing could ever fill the entry).
func TestCacheFailFast(t *testing.T) {
	g, _ := startGuard(t)
	var calls atomic.Int64
	h := func(c *gin.Context) { calls.Add(1); c.String(http.StatusOK, "filled") }
	r := newEngine()
	r.GET("/bg", ginmw.Cache(g, time.Minute, ginmw.CacheOptions(cacheguard.FailFast()), ginmw.BackgroundRefresh(r)), h)
	r.GET("/direct", ginmw.Cache(g, time.Minute, ginmw.CacheOptions(cacheguard.FailFast())), h)

	// The background fill asks for a handler: this request's, if it is still
	// in Cache when the fill gets the lease (MISS), or else a copy of it sent
	// through the engine while this request is answered 503.
	switch w := serve(r, http.MethodGet, "/bg"); {
	case w.Code == http.StatusOK && w.Header().Get("X-Cache") == "MISS":
	case w.Code == http.StatusServiceUnavailable && w.Header().Get("Retry-After") == "1":
		if b := decodeError(t, w); b.Error != "cached response unavailable" {
			t.Fatalf("body %+v", b)
		}
	default:
		t.Fatalf("cold FailFast: %d X-Cache %q Retry-After %q", w.Code, w.Header().Get("X-Cache"), w.Header().Get("Retry-After"))
	}
	eventually(t, 10*time.Second, "the background fill", func() bool {
		w := serve(r, http.MethodGet, "/bg")
		return w.Code == http.StatusOK && w.Header().Get("X-Cache") == "HIT" && w.Body.String() == "filled"
	})
	wantCalls(t, &calls, 1)

	// Without BackgroundRefresh: served here, as the fill (MISS) or directly (BYPASS).
	if w := serve(r, http.MethodGet, "/direct"); w.Code != http.StatusOK || (w.Header().Get("X-Cache") != "BYPASS" && w.Header().Get("X-Cache") != "MISS") {
		t.Fatalf("FailFast without BackgroundRefresh: %d %q", w.Code, w.Header().Get("X-Cache"))
	}
}

// A request whose wait budget ends while another request loads the entry is
// answered 503 with Retry-After, without running the handler.
func TestCacheWaitBudget(t *testing.T) {
	g, _ := startGuard(t)
	release := make(chan struct{})
	var calls atomic.Int64
	r := newEngine()
	h := func(c *gin.Context) {
		calls.Add(1)
		<-release
		c.String(http.StatusOK, "slow")
	}
	// Two routes on one entry: the leader's budget is long, so that a loaded
	// machine's first round trip cannot use it up before the load starts.
	key := ginmw.CacheKey(ginmw.Resource("slow", ginmw.Func(func(*gin.Context) (string, error) { return "1", nil })))
	r.GET("/lead", ginmw.Cache(g, time.Minute, key, ginmw.CacheOptions(cacheguard.WaitBudget(time.Minute), cacheguard.LoadTimeout(time.Minute))), h)
	r.GET("/slow", ginmw.Cache(g, time.Minute, key, ginmw.CacheOptions(cacheguard.WaitBudget(50*time.Millisecond), cacheguard.LoadTimeout(time.Minute))), h)
	leader := make(chan *httptest.ResponseRecorder, 1)
	go func() { leader <- serve(r, http.MethodGet, "/lead") }()
	eventually(t, 10*time.Second, "the leader to run the handler", func() bool { return calls.Load() == 1 })
	w := serve(r, http.MethodGet, "/slow")
	close(release)
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
		t.Fatalf("waiter: %d Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	if lw := <-leader; lw.Code != http.StatusOK || lw.Body.String() != "slow" {
		t.Fatalf("leader: %d %q", lw.Code, lw.Body)
	}
	wantCalls(t, &calls, 1)
}

// The request that runs the handler for others keeps running it when its own
// client goes away: the handler's context is detached from that client, and
// the requests waiting for the load get the response.
func TestCacheLeaderDisconnectDoesNotCancelLoad(t *testing.T) {
	g, _ := startGuard(t)
	entered, release := make(chan struct{}), make(chan struct{})
	var handlerCtxErr error
	type ctxKey struct{}
	var sawValue bool
	r := newEngine()
	r.Use(func(c *gin.Context) {
		c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), ctxKey{}, "kept"))
	})
	// The leader comes through a real server (127.0.0.1:port), the follower
	// not (example.com): one entry for both.
	r.GET("/slow", ginmw.Cache(g, time.Minute, ginmw.IgnoreHost()), func(c *gin.Context) {
		close(entered)
		<-release
		handlerCtxErr = c.Request.Context().Err()
		sawValue = c.Request.Context().Value(ctxKey{}) == "kept"
		c.String(http.StatusOK, "loaded")
	})
	cancel, errc := startRequest(t, r, http.MethodGet, "/slow")
	within(t, 10*time.Second, entered, "the leader's handler")
	follower := make(chan *httptest.ResponseRecorder, 1)
	go func() { follower <- serve(r, http.MethodGet, "/slow") }()
	eventually(t, 10*time.Second, "the follower to wait", func() bool { return totalMisses(g) == 2 })
	cancel() // the leader's client goes away
	<-errc
	close(release)
	w := <-follower
	if w.Code != http.StatusOK || w.Body.String() != "loaded" || w.Header().Get("X-Cache") != "COALESCED" {
		t.Fatalf("follower: %d %q %q", w.Code, w.Body, w.Header().Get("X-Cache"))
	}
	if handlerCtxErr != nil || !sawValue {
		t.Fatalf("handler context: err %v, value kept %v", handlerCtxErr, sawValue)
	}
}

// InvalidateAfter leaves the cache alone when the write failed.
func TestCacheInvalidateAfterOnlyOnSuccess(t *testing.T) {
	g, rdb := startGuard(t)
	repo := ginmw.Resource("repos", ginmw.Param("id"))
	r := newEngine()
	r.GET("/repos/:id", ginmw.Cache(g, time.Minute, ginmw.CacheKey(repo)), func(c *gin.Context) { c.String(http.StatusOK, "v") })
	r.PUT("/repos/:id", ginmw.InvalidateAfter(g, repo), func(c *gin.Context) { c.Status(http.StatusUnprocessableEntity) })
	serve(r, http.MethodGet, "/repos/3")
	waitEntries(t, rdb, 1)
	if w := serve(r, http.MethodPut, "/repos/3"); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("PUT: %d", w.Code)
	}
	if w := serve(r, http.MethodGet, "/repos/3"); w.Header().Get("X-Cache") != "HIT" {
		t.Fatalf("after a failed write: %q, want HIT", w.Header().Get("X-Cache"))
	}
}

// With cacheguard.FailSafe, a page whose reload answers 5xx is served from
// the older stored response, marked X-Cache: STALE; a 4xx (an answer, not a
// failure) is not replaced.
func TestCacheFailSafeServesStale(t *testing.T) {
	g, _ := startGuard(t)
	var status atomic.Int64
	status.Store(http.StatusOK)
	r := newEngine()
	r.GET("/page", ginmw.Cache(g, 50*time.Millisecond, ginmw.CacheOptions(cacheguard.Jitter(0), cacheguard.FailSafe(time.Minute, time.Second))),
		func(c *gin.Context) { c.String(int(status.Load()), "status %d", status.Load()) })
	if w := serve(r, http.MethodGet, "/page"); w.Code != http.StatusOK {
		t.Fatalf("first: %d", w.Code)
	}
	status.Store(http.StatusServiceUnavailable)
	eventually(t, 5*time.Second, "the older page served for a failing reload", func() bool {
		w := serve(r, http.MethodGet, "/page")
		return w.Code == http.StatusOK && w.Header().Get("X-Cache") == "STALE" && w.Body.String() == "status 200"
	})
}

// With BackgroundRefresh (early refresh on), a response is never served past
// its freshness — here the route's TTL, for a response without freshness
// information — by cacheguard's stale grace (RFC 9111 §4.2.4: no stale
// response without permission): past the TTL a GET is a MISS or a COALESCED
// wait, never a STALE of the old body.
func TestCacheNoStaleGraceWithBackgroundRefresh(t *testing.T) {
	g, _ := startGuard(t)
	var version atomic.Int64
	r := newEngine()
	const ttl = 400 * time.Millisecond
	r.GET("/g", ginmw.Cache(g, ttl, ginmw.BackgroundRefresh(r), ginmw.CacheOptions(cacheguard.Jitter(0))), func(c *gin.Context) {
		c.String(http.StatusOK, fmt.Sprint("v", version.Add(1)))
	})
	if w := serve(r, http.MethodGet, "/g"); w.Body.String() != "v1" {
		t.Fatalf("first: %q", w.Body)
	}
	eventually(t, 10*time.Second, "a new version after the TTL", func() bool {
		w := serve(r, http.MethodGet, "/g")
		if w.Header().Get("X-Cache") == "STALE" {
			t.Fatalf("served %q STALE past its freshness", w.Body)
		}
		return w.Body.String() != "v1"
	})
}
