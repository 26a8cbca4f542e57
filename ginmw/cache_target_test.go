package ginmw_test

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/ginmw"
)

// Issue 45 item 1: a request no route matches is answered as Gin answers it
// (404, or 405 with HandleMethodNotAllowed), and nothing of it is stored.
func TestCacheUnroutedIsNotStored(t *testing.T) {
	g, rdb := startGuard(t)
	r := newEngine()
	r.HandleMethodNotAllowed = true
	r.Use(ginmw.Cache(g, time.Minute))
	r.GET("/api/data", func(c *gin.Context) { c.String(http.StatusOK, "data") })
	r.POST("/only-post", func(c *gin.Context) { c.String(http.StatusOK, "posted") })

	for range 2 {
		if w := serve(r, http.MethodGet, "/nowhere"); w.Code != http.StatusNotFound {
			t.Errorf("GET /nowhere: %d %q, X-Cache %q, want 404", w.Code, w.Body, w.Header().Get("X-Cache"))
		}
		if w := serve(r, http.MethodGet, "/only-post"); w.Code != http.StatusMethodNotAllowed {
			t.Errorf("GET /only-post: %d %q, X-Cache %q, want 405", w.Code, w.Body, w.Header().Get("X-Cache"))
		}
	}
	if n, err := storedEntries(rdb); err != nil || n != 0 {
		t.Errorf("%d stored entries (%v), want 0", n, err)
	}
}

// Issue 45 item 2: a request target with dot segments is keyed by the path
// Gin routed, so the page of the route it reached is never stored under the
// key of another route's path.
func TestCacheDotSegmentsDoNotPoisonAnotherRoute(t *testing.T) {
	g, _ := startGuard(t)
	r := newEngine()
	r.Use(ginmw.Cache(g, time.Minute))
	r.GET("/api/data", func(c *gin.Context) { c.String(http.StatusOK, "data") })
	r.GET("/app/*any", func(c *gin.Context) { c.String(http.StatusOK, "app page "+c.Param("any")) })

	for _, target := range []string{"/app/../api/data", "/x/../api/data", "/api/./data"} {
		w := serve(r, http.MethodGet, target)
		t.Logf("GET %s: %d %q", target, w.Code, w.Body)
	}
	if w := serve(r, http.MethodGet, "/api/data"); w.Code != http.StatusOK || w.Body.String() != "data" {
		t.Errorf("GET /api/data after dot-segment requests: %d %q, X-Cache %q, want 200 \"data\"",
			w.Code, w.Body, w.Header().Get("X-Cache"))
	}
}

// Issue 45 item 3: an encoded "?" in the path and a query are keyed apart.
func TestCacheEncodedQuestionMarkIsNotAQuery(t *testing.T) {
	g, _ := startGuard(t)
	r := newEngine()
	r.UseRawPath = true
	r.Use(ginmw.Cache(g, time.Minute))
	r.GET("/p/:slug", func(c *gin.Context) {
		c.String(http.StatusOK, "slug="+c.Param("slug")+" b="+c.Query("b"))
	})
	first := serve(r, http.MethodGet, "/p/a%3Fb=c")
	second := serve(r, http.MethodGet, "/p/a?b=c")
	if first.Body.String() == second.Body.String() {
		t.Errorf("/p/a%%3Fb=c and /p/a?b=c got the same page %q (X-Cache %q)", second.Body, second.Header().Get("X-Cache"))
	}
	if want := "slug=a b=c"; second.Body.String() != want {
		t.Errorf("/p/a?b=c: %q, want %q", second.Body, want)
	}
}

// A target whose path is not validly escaped (a raw "#", which Go's server
// keeps in URL.RawPath while EscapedPath spells it "%23") bypasses Cache:
// under UseRawPath (and UnescapePathValues false) Gin routes on the raw
// spelling and passes it on, so /app/api/#/ and
// /app/%61pi/#/ reach the handler with different parameters, while their
// escaped paths are one ("/app/api/%23/"). Found by TestGenRouting at scale
// 10 (after 2007 tests).
func TestCacheInvalidRawPathBypasses(t *testing.T) {
	g, rdb := startGuard(t)
	r := newEngine()
	r.UseRawPath, r.UnescapePathValues = true, false
	r.Use(ginmw.Cache(g, time.Minute))
	r.GET("/app/*any", func(c *gin.Context) { c.String(http.StatusOK, "any="+c.Param("any")) })
	for _, tc := range []struct{ target, want, xcache string }{
		{"/app/api/%23/", "any=/api/#/", "MISS"},
		{"/app/api/#/", "any=/api/#/", "BYPASS"},
		{"/app/%61pi/#/", "any=/%61pi/#/", "BYPASS"},
		{"/app/api/%23/", "any=/api/#/", "HIT"},
	} {
		w := serve(r, http.MethodGet, tc.target)
		if w.Body.String() != tc.want || w.Header().Get("X-Cache") != tc.xcache {
			t.Errorf("GET %s: %q, X-Cache %q; want %q, %s", tc.target, w.Body, w.Header().Get("X-Cache"), tc.want, tc.xcache)
		}
	}
	if n, err := storedEntries(rdb); err != nil || n != 1 {
		t.Errorf("%d stored entries (%v), want 1", n, err)
	}
}

// Issue 45 item 4: header fields the handler wrote into the map without
// canonicalising their names are read as net/http reads them.
func TestCacheReadsHeaderNamesCaseInsensitively(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(h http.Header)
	}{
		{"cache-control: private", func(h http.Header) { h["cache-control"] = []string{"private"} }},
		{"CACHE-CONTROL: no-store", func(h http.Header) { h["CACHE-CONTROL"] = []string{"no-store"} }},
		{"set-cookie", func(h http.Header) { h["set-cookie"] = []string{"session=x"} }},
		{"vary: cookie", func(h http.Header) { h["vary"] = []string{"Cookie"} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, rdb := startGuard(t)
			var calls atomic.Int64
			r := newEngine()
			r.GET("/account", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
				calls.Add(1)
				user, _ := c.Cookie("session")
				tc.set(c.Writer.Header())
				c.String(http.StatusOK, "account of "+user)
			})
			serve(r, http.MethodGet, "/account", "Cookie", "session=alice")
			w := serve(r, http.MethodGet, "/account", "Cookie", "session=bob")
			if w.Body.String() != "account of bob" {
				t.Errorf("bob got %q, X-Cache %q", w.Body, w.Header().Get("X-Cache"))
			}
			if n, err := storedEntries(rdb); err != nil || n != 0 {
				t.Errorf("%d stored entries (%v), want 0", n, err)
			}
			wantCalls(t, &calls, 2)
		})
	}
}
