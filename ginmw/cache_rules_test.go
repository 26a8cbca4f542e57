package ginmw_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// headerCase is one response (and the requests it answers) of the shared-cache
// rules: whether a request that waited for its load is given it (shared), and
// whether a request of another process served after it gets it from Redis
// (stored).
type headerCase struct {
	name   string
	status int
	resp   []string // header name, value pairs the handler sets
	req    []string // header name, value pairs of every request (besides X-User)
	opts   []ginmw.CacheOption
	shared bool
	stored bool
}

var past = time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)

var headerCases = []headerCase{
	{name: "no directive", shared: true, stored: true},
	{name: "public", resp: []string{"Cache-Control", "public"}, shared: true, stored: true},
	{name: "max-age at TTL", resp: []string{"Cache-Control", "max-age=60"}, shared: true, stored: true},
	{name: "response Pragma ignored", resp: []string{"Pragma", "no-cache"}, shared: true, stored: true},
	{name: "no-store", resp: []string{"Cache-Control", "no-store"}},
	{name: "private", resp: []string{"Cache-Control", "private"}},
	{name: "private qualified", resp: []string{"Cache-Control", `private="X-User-Id"`}},
	{name: "no-cache", resp: []string{"Cache-Control", "no-cache"}},
	{name: "no-cache qualified", resp: []string{"Cache-Control", `no-cache="Set-Cookie", max-age=60`}},
	{name: "upper case", resp: []string{"Cache-Control", "Public, NO-STORE"}},
	// Malformed: read as no-store, whatever the sender meant.
	{name: "no-store; (malformed)", resp: []string{"Cache-Control", "no-store;"}},
	{name: "private; max-age (malformed)", resp: []string{"Cache-Control", "private; max-age=60"}},
	{name: "no-cache; no-store (malformed)", resp: []string{"Cache-Control", "no-cache; no-store"}},
	{name: "max-age then a space (malformed)", resp: []string{"Cache-Control", "public, max-age=60 private"}},
	{name: "quoted then junk (malformed)", resp: []string{"Cache-Control", `max-age="60";private`}},
	{name: "two lines", resp: []string{"Cache-Control", "public", "Cache-Control", "private"}},
	{name: "private no-store Vary Cookie", resp: []string{"Cache-Control", "private, no-store", "Vary", "Cookie"}},
	{name: "Set-Cookie", resp: []string{"Set-Cookie", "session=x"}},
	{name: "Set-Cookie public", resp: []string{"Set-Cookie", "session=x", "Cache-Control", "public, max-age=60"}},
	{name: "Vary *", resp: []string{"Vary", "*"}},
	{name: "Vary Cookie", resp: []string{"Vary", "Cookie"}},
	{name: "Vary unkeyed header", resp: []string{"Vary", "Accept-Language"}},
	{name: "Vary keyed header", resp: []string{"Vary", "accept-language"}, req: []string{"Accept-Language", "fr"},
		opts: []ginmw.CacheOption{ginmw.VaryByHeader("Accept-Language")}, shared: true, stored: true},
	{name: "Vary keyed and unkeyed", resp: []string{"Vary", "Accept-Language, Cookie"}, req: []string{"Accept-Language", "fr"},
		opts: []ginmw.CacheOption{ginmw.VaryByHeader("Accept-Language")}},
	{name: "Authorization", req: []string{"Authorization", "Bearer t"}},
	{name: "Authorization public", req: []string{"Authorization", "Bearer t"}, resp: []string{"Cache-Control", "public"}, shared: true, stored: true},
	{name: "Authorization s-maxage", req: []string{"Authorization", "Bearer t"}, resp: []string{"Cache-Control", "s-maxage=60"}, shared: true, stored: true},
	{name: "Authorization must-revalidate", req: []string{"Authorization", "Bearer t"}, resp: []string{"Cache-Control", "must-revalidate"}, shared: true, stored: true},
	{name: "Authorization max-age", req: []string{"Authorization", "Bearer t"}, resp: []string{"Cache-Control", "max-age=60"}},
	{name: "Authorization public private", req: []string{"Authorization", "Bearer t"}, resp: []string{"Cache-Control", "public, private"}},
	{name: "Authorization 404", req: []string{"Authorization", "Bearer t"}, status: http.StatusNotFound},
	{name: "max-age=0", resp: []string{"Cache-Control", "max-age=0"}},
	{name: "max-age invalid", resp: []string{"Cache-Control", "max-age=soon"}},
	{name: "s-maxage=0 beats max-age", resp: []string{"Cache-Control", "s-maxage=0, max-age=60"}},
	{name: "max-age beats Expires", resp: []string{"Cache-Control", "max-age=60", "Expires", past}, shared: true, stored: true},
	{name: "Expires past", resp: []string{"Expires", past}},
	{name: "Expires invalid", resp: []string{"Expires", "0"}},
	{name: "status 404", status: http.StatusNotFound, shared: true},
	{name: "status 502", status: http.StatusBadGateway, shared: true},
	{name: "status 302", status: http.StatusFound, resp: []string{"Location", "/elsewhere"}, shared: true},
	{name: "status 404 private", status: http.StatusNotFound, resp: []string{"Cache-Control", "private"}},
	{name: "status 206", status: http.StatusPartialContent},
	{name: "status 204", status: http.StatusNoContent, shared: true, stored: true},
	{name: "body over MaxBody", resp: []string{"X-Big", "1"}, opts: []ginmw.CacheOption{ginmw.MaxBody(8)}, shared: true},
	{name: "body over MaxBody private", resp: []string{"X-Big", "1", "Cache-Control", "private"}, opts: []ginmw.CacheOption{ginmw.MaxBody(8)}},
	{name: "body over MaxSharedBody", resp: []string{"X-Big", "1"}, opts: []ginmw.CacheOption{ginmw.MaxBody(8), ginmw.MaxSharedBody(16)}},
}

// Each header case, answered by a real Gin engine over a real redis-server:
// user a's request runs the handler while user b's request waits for that
// load on the same engine (is b given a's response?), then user c asks another
// engine sharing the Redis — another process — where only storage can give it
// a's response. HEAD follows the same rules.
func TestCacheHeaderCases(t *testing.T) {
	s := redistest.Start(t)
	for i, tc := range headerCases {
		for _, method := range []string{http.MethodGet, http.MethodHead} {
			t.Run(tc.name+"/"+method, func(t *testing.T) {
				testHeaderCase(t, s, fmt.Sprintf("/case/%d", i), method, tc)
			})
		}
	}
}

func testHeaderCase(t *testing.T, s *redistest.Server, path, method string, tc headerCase) {
	g1, rdb := newGuard(t, s)
	g2, _ := newGuard(t, s)
	gate := make(chan struct{})
	var calls atomic.Int64
	handler := func(c *gin.Context) {
		calls.Add(1)
		user := c.GetHeader("X-User")
		if user == "a" {
			<-gate
		}
		for i := 0; i+1 < len(tc.resp); i += 2 {
			c.Writer.Header().Add(tc.resp[i], tc.resp[i+1])
		}
		status := tc.status
		if status == 0 {
			status = http.StatusOK
		}
		body := "for " + user
		if c.Writer.Header().Get("X-Big") != "" {
			body = strings.Repeat(body, 4)
		}
		if status == http.StatusNoContent {
			c.Header("X-For", user)
			c.Status(status)
			return
		}
		c.Header("X-For", user)
		c.String(status, body)
	}
	e1, e2 := newEngine(), newEngine()
	e1.Handle(method, path, ginmw.Cache(g1, time.Minute, tc.opts...), handler)
	e2.Handle(method, path, ginmw.Cache(g2, time.Minute, tc.opts...), handler)
	as := func(r http.Handler, user string) *httptest.ResponseRecorder {
		return serve(r, method, path, append([]string{"X-User", user}, tc.req...)...)
	}

	aDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { aDone <- as(e1, "a") }()
	bDone := make(chan *httptest.ResponseRecorder, 1)
	eventually(t, 10*time.Second, "a's load to start", func() bool { return calls.Load() == 1 })
	go func() { bDone <- as(e1, "b") }()
	eventually(t, 10*time.Second, "b to wait for a's load", func() bool { return totalMisses(g1) == 2 })
	close(gate)
	a, b := <-aDone, <-bDone
	if got := a.Header().Get("X-For"); got != "a" || a.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("a: X-For %q, X-Cache %q", got, a.Header().Get("X-Cache"))
	}
	switch got := b.Header().Get("X-For"); {
	case tc.shared && (got != "a" || b.Header().Get("X-Cache") != "COALESCED"):
		t.Errorf("b waited for a's load: X-For %q, X-Cache %q; want a's response, shared", got, b.Header().Get("X-Cache"))
	case !tc.shared && (got != "b" || b.Header().Get("X-Cache") != "BYPASS"):
		t.Errorf("b waited for a's load: X-For %q, X-Cache %q; want its own response", got, b.Header().Get("X-Cache"))
	}
	if tc.shared && method == http.MethodGet && b.Body.String() != a.Body.String() {
		t.Errorf("b: body %q, a's was %q", b.Body, a.Body)
	}

	c := as(e2, "c")
	switch got := c.Header().Get("X-For"); {
	case tc.stored && (got != "a" || c.Header().Get("X-Cache") != "HIT"):
		t.Errorf("c, in another process: X-For %q, X-Cache %q; want a's response, stored", got, c.Header().Get("X-Cache"))
	case !tc.stored && (got != "c" || c.Header().Get("X-Cache") != "MISS"):
		t.Errorf("c, in another process: X-For %q, X-Cache %q; want its own response", got, c.Header().Get("X-Cache"))
	}
	// The fields of the entry's values hash (see cacheguard's "Keys").
	if n, err := rdb.HLen(context.Background(), "cg:v:{"+ginmw.PathKey(path, nil)+"}").Result(); err != nil || (n > 0) != tc.stored {
		t.Errorf("%d stored entries (%v), stored %v", n, err, tc.stored)
	}
}

// Requests' own directives: no-store and Range always bypass; no-cache,
// max-age=0 and Pragma: no-cache are ignored unless HonorRequestNoCache.
func TestCacheRequestDirectives(t *testing.T) {
	g, rdb := startGuard(t)
	var calls atomic.Int64
	h := func(c *gin.Context) { c.String(http.StatusOK, "v"+strconv.FormatInt(calls.Add(1), 10)) }
	r := newEngine()
	r.GET("/default", ginmw.Cache(g, time.Minute), h)
	r.GET("/honor", ginmw.Cache(g, time.Minute, ginmw.HonorRequestNoCache()), h)
	for _, path := range []string{"/default", "/honor"} {
		if w := serve(r, http.MethodGet, path); w.Header().Get("X-Cache") != "MISS" {
			t.Fatalf("%s: X-Cache %q", path, w.Header().Get("X-Cache"))
		}
	}
	waitEntries(t, rdb, 2)
	for _, tc := range []struct {
		path   string
		header []string
		xcache string
	}{
		{"/default", []string{"Cache-Control", "no-store"}, "BYPASS"},
		{"/default", []string{"Range", "bytes=0-0"}, "BYPASS"},
		{"/default", []string{"Cache-Control", "no-cache"}, "HIT"},
		{"/default", []string{"Cache-Control", "max-age=0"}, "HIT"},
		{"/default", []string{"Pragma", "no-cache"}, "HIT"},
		{"/honor", []string{"Cache-Control", "no-cache"}, "BYPASS"},
		{"/honor", []string{"Cache-Control", "max-age=0"}, "BYPASS"},
		{"/honor", []string{"Pragma", "no-cache"}, "BYPASS"},
		{"/honor", []string{"Pragma", "no-cache", "Cache-Control", "max-age=60"}, "HIT"},
		{"/honor", []string{"Cache-Control", "no-store"}, "BYPASS"},
		{"/honor", nil, "HIT"},
	} {
		if w := serve(r, http.MethodGet, tc.path, tc.header...); w.Header().Get("X-Cache") != tc.xcache {
			t.Errorf("%s %v: X-Cache %q, want %q", tc.path, tc.header, w.Header().Get("X-Cache"), tc.xcache)
		}
	}
	// A bypass never replaced the stored responses.
	for path, want := range map[string]string{"/default": "v1", "/honor": "v2"} {
		if w := serve(r, http.MethodGet, path); w.Body.String() != want {
			t.Errorf("%s: %q, want the stored %q", path, w.Body, want)
		}
	}
}

// A response's own lifetime (max-age here) shorter than the TTL bounds how
// long it is served: no request gets a response produced more than its
// lifetime before the request was sent, and each lifetime costs one load
// across two processes.
func TestCacheLifetimeShorterThanTTL(t *testing.T) {
	s := redistest.Start(t)
	g1, _ := newGuard(t, s)
	g2, _ := newGuard(t, s)
	var loads atomic.Int64
	h := func(c *gin.Context) {
		n := loads.Add(1)
		c.Header("Cache-Control", "max-age=1")
		c.String(http.StatusOK, "%d %d", n, time.Now().UnixMilli())
	}
	engines := []*gin.Engine{newEngine(), newEngine()}
	engines[0].GET("/short", ginmw.Cache(g1, time.Hour, ginmw.CacheOptions(cacheguard.Jitter(0))), h)
	engines[1].GET("/short", ginmw.Cache(g2, time.Hour, ginmw.CacheOptions(cacheguard.Jitter(0))), h)
	seen := map[int64]bool{}
	i := 0
	eventually(t, 30*time.Second, "four responses in turn", func() bool {
		before := time.Now().UnixMilli()
		w := serve(engines[i%2], http.MethodGet, "/short")
		var n, made int64
		if _, err := fmt.Sscan(w.Body.String(), &n, &made); err != nil || w.Code != http.StatusOK {
			t.Fatalf("answer %d: %d %q", i, w.Code, w.Body)
		}
		if made < before-1000-1000 { // its lifetime, and (generously) the time to store it
			t.Fatalf("answer %d (%s): response %d made %d ms before the request, past its max-age=1", i, w.Header().Get("X-Cache"), n, before-made)
		}
		seen[n] = true
		i++
		return len(seen) == 4
	})
	if got := loads.Load(); got != int64(len(seen)) {
		t.Fatalf("%d loads for %d responses served", got, len(seen))
	}
}

// A response with must-revalidate is never served stale, even under
// ServeStale: the request waits for a fresh one. Without it, the stale one is
// served.
func TestCacheMustRevalidateNeverServedStale(t *testing.T) {
	g, _ := startGuard(t)
	var version atomic.Int64
	r := newEngine()
	opts := func() []ginmw.CacheOption {
		return []ginmw.CacheOption{ginmw.CacheOptions(cacheguard.ServeStale(time.Minute), cacheguard.Jitter(0)), ginmw.BackgroundRefresh(r)}
	}
	r.GET("/strict", ginmw.Cache(g, 50*time.Millisecond, opts()...), func(c *gin.Context) {
		c.Header("Cache-Control", "must-revalidate")
		c.String(http.StatusOK, "v%d %d", version.Add(1), time.Now().UnixMilli())
	})
	r.GET("/lax", ginmw.Cache(g, 50*time.Millisecond, opts()...), func(c *gin.Context) {
		c.String(http.StatusOK, "v%d %d", version.Add(1), time.Now().UnixMilli())
	})
	stale := 0
	eventually(t, 30*time.Second, "the lax route served stale three times", func() bool {
		before := time.Now().UnixMilli()
		w := serve(r, http.MethodGet, "/strict")
		var v string
		var made int64
		if _, err := fmt.Sscan(w.Body.String(), &v, &made); err != nil {
			t.Fatalf("strict: %q", w.Body)
		}
		if w.Header().Get("X-Cache") == "STALE" || made < before-50-1000 {
			t.Fatalf("strict: %s made %d ms before the request, X-Cache %q", v, before-made, w.Header().Get("X-Cache"))
		}
		if serve(r, http.MethodGet, "/lax").Header().Get("X-Cache") == "STALE" {
			stale++
		}
		return stale == 3
	})
}

// Conditional requests are answered from the response a request may be given,
// and only from it: a request that waited for a shared (unstored) response
// gets 304 when its validator matches that response; a request that may not
// be given the loaded response (private) never gets a 304 from its ETag: its
// own handler runs (with its validators, as for any bypass).
func TestCacheConditionalFollowsSharing(t *testing.T) {
	g, _ := startGuard(t)
	var calls atomic.Int64
	gate := make(chan struct{})
	r := newEngine()
	page := func(cc string) gin.HandlerFunc {
		return func(c *gin.Context) {
			calls.Add(1)
			user := c.GetHeader("X-User")
			if user == "a" {
				<-gate
			}
			if cc != "" {
				c.Header("Cache-Control", cc)
			}
			c.Header("ETag", `"`+user+`"`)
			c.String(http.StatusOK, strings.Repeat("for "+user+" ", 8))
		}
	}
	r.GET("/big", ginmw.Cache(g, time.Minute, ginmw.MaxBody(16)), page(""))
	r.GET("/mine", ginmw.Cache(g, time.Minute), page("private"))
	for _, tc := range []struct {
		path      string
		want304   bool // b, sending If-None-Match: "a"
		wantOwner string
	}{
		{"/big", true, "a"},
		{"/mine", false, "b"},
	} {
		calls.Store(0)
		before := totalMisses(g)
		aDone := make(chan *httptest.ResponseRecorder, 1)
		go func() { aDone <- serve(r, http.MethodGet, tc.path, "X-User", "a") }()
		eventually(t, 10*time.Second, "a's load to start", func() bool { return calls.Load() == 1 })
		bDone := make(chan *httptest.ResponseRecorder, 1)
		go func() { bDone <- serve(r, http.MethodGet, tc.path, "X-User", "b", "If-None-Match", `"a"`) }()
		eventually(t, 10*time.Second, "b to wait for a's load", func() bool { return totalMisses(g) == before+2 })
		gate <- struct{}{}
		a, b := <-aDone, <-bDone
		if a.Code != http.StatusOK || a.Header().Get("ETag") != `"a"` {
			t.Fatalf("%s: a got %d ETag %s", tc.path, a.Code, a.Header().Get("ETag"))
		}
		switch {
		case tc.want304 && (b.Code != http.StatusNotModified || b.Body.Len() != 0):
			t.Errorf("%s: b, whose validator matches the shared response: %d %q", tc.path, b.Code, b.Body)
		case !tc.want304 && (b.Code != http.StatusOK || b.Header().Get("ETag") != `"`+tc.wantOwner+`"`):
			t.Errorf("%s: b got %d ETag %s, want its own 200", tc.path, b.Code, b.Header().Get("ETag"))
		}
	}
}

// A hit hands the request copies of the stored response's header values:
// middleware after Cache that edits its response's header in place (here a
// per-request nonce filled into a CSP) edits that request's copy, never the
// response stored in the near cache and served to every later request.
func TestCacheHitHeaderIsTheRequestsOwn(t *testing.T) {
	g, _ := newGuard(t, redistest.Start(t), cacheguard.NearCache(100, time.Minute))
	r := newEngine()
	r.Use(func(c *gin.Context) {
		c.Next()
		h := c.Writer.Header()
		for _, k := range []string{"Content-Security-Policy", "X-Cache"} {
			vs := h[k]
			for i := range vs {
				vs[i] = strings.ReplaceAll(vs[i], "{nonce}", "nonce-of-"+c.GetHeader("X-User"))
				vs[i] = strings.ToLower(vs[i]) // X-Cache too: its values are no one else's
			}
		}
	})
	r.GET("/page", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		c.Header("Content-Security-Policy", "script-src 'nonce-{nonce}'")
		c.String(http.StatusOK, "page")
	})
	serve(r, http.MethodGet, "/page", "X-User", "a")
	eventually(t, 10*time.Second, "the page cached", func() bool {
		return serve(r, http.MethodGet, "/page", "X-User", "a").Header().Get("X-Cache") == "hit"
	})
	w := serve(r, http.MethodGet, "/page", "X-User", "b")
	if got := w.Header().Get("Content-Security-Policy"); got != "script-src 'nonce-nonce-of-b'" {
		t.Fatalf("user b got CSP %q (X-Cache %s), want its own nonce", got, w.Header().Get("X-Cache"))
	}
}

// PathKey of a path longer than cacheguard.MaxKeyLen is the hashed name the
// entry is stored under: Invalidate of it reaches the entry (it failed with
// "key exceeds 1024" and the entry stayed, before; outside probe).
func TestPathKeyOfLongPathInvalidates(t *testing.T) {
	g, rdb := startGuard(t)
	var calls atomic.Int64
	r := newEngine()
	r.GET("/files/*p", ginmw.Cache(g, time.Minute), func(c *gin.Context) {
		n := calls.Add(1)
		c.String(http.StatusOK, "v%d", n)
	})
	path := "/files/" + strings.Repeat("a", 1100)
	if w := serve(r, http.MethodGet, path); w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("first: X-Cache %q", w.Header().Get("X-Cache"))
	}
	waitEntries(t, rdb, 1)
	if err := g.Invalidate(context.Background(), ginmw.PathKey(path, nil)); err != nil {
		t.Errorf("Invalidate(PathKey(%d-byte path)): %v", len(path), err)
	}
	if w := serve(r, http.MethodGet, path); w.Body.String() != "v2" {
		t.Fatalf("after Invalidate(PathKey): X-Cache %q body %q, want a reload (v2)", w.Header().Get("X-Cache"), w.Body.String())
	}
}
