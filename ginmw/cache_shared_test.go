package ginmw_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// accountPage answers the account of the user its session cookie names, as a
// page that must reach that user only: private, no-store, Vary: Cookie. It
// sets no cookie. Each request of user "alice" waits for aliceGate first when
// it is not nil.
func accountPage(calls *atomic.Int64, aliceGate <-chan struct{}) gin.HandlerFunc {
	return func(c *gin.Context) {
		calls.Add(1)
		user, _ := c.Cookie("session")
		if user == "alice" && aliceGate != nil {
			<-aliceGate
		}
		c.Header("Cache-Control", "private, no-store")
		c.Header("Vary", "Cookie")
		c.String(http.StatusOK, "account of "+user)
	}
}

// Alice's private page is never served to Bob: not from Redis (two engines
// sharing one Redis, as two processes do, where storage decides the outcome),
// and not from the load Bob waited for in the same process.
func TestCachePrivateResponseNeverServedToAnotherUser(t *testing.T) {
	s := redistest.Start(t)
	ga, rdb := newGuard(t, s)
	gb, _ := newGuard(t, s)
	var calls atomic.Int64
	a, b := newEngine(), newEngine()
	a.GET("/account", ginmw.Cache(ga, time.Minute), accountPage(&calls, nil))
	b.GET("/account", ginmw.Cache(gb, time.Minute), accountPage(&calls, nil))

	if w := serve(a, http.MethodGet, "/account", "Cookie", "session=alice"); w.Body.String() != "account of alice" {
		t.Fatalf("alice: %q", w.Body)
	}
	if n, err := storedEntries(rdb); err != nil || n != 0 {
		t.Errorf("after alice's private page: %d stored entries (%v), want 0", n, err)
	}
	for name, r := range map[string]*gin.Engine{"engine B": b, "engine A": a} {
		w := serve(r, http.MethodGet, "/account", "Cookie", "session=bob")
		if w.Body.String() != "account of bob" || w.Header().Get("X-Cache") == "HIT" {
			t.Errorf("bob on %s: %q, X-Cache %q", name, w.Body, w.Header().Get("X-Cache"))
		}
	}
	if calls.Load() != 3 {
		t.Errorf("handler ran %d times, want 3", calls.Load())
	}

	// Bob arrives while Alice's page is being loaded, and waits for that load.
	gate := make(chan struct{})
	c := newEngine()
	gc, _ := newGuard(t, s)
	c.GET("/account2", ginmw.Cache(gc, time.Minute), accountPage(&calls, gate))
	aliceDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { aliceDone <- serve(c, http.MethodGet, "/account2", "Cookie", "session=alice") }()
	bobDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { bobDone <- serve(c, http.MethodGet, "/account2", "Cookie", "session=bob") }()
	eventually(t, 10*time.Second, "both requests to miss", func() bool { return totalMisses(gc) == 2 })
	close(gate)
	if w := <-bobDone; w.Body.String() != "account of bob" {
		t.Errorf("bob, waiting for alice's load: %q, X-Cache %q", w.Body, w.Header().Get("X-Cache"))
	}
	if w := <-aliceDone; w.Body.String() != "account of alice" {
		t.Fatalf("alice: %q", w.Body)
	}
}

// A page larger than MaxBody is not stored, but it still runs its handler once
// for the requests of a process that want it at the same time: they share the
// one response. That load is an answer, not a failed one.
func TestCacheLargeResponseCoalesced(t *testing.T) {
	s := redistest.Start(t)
	var mu sync.Mutex
	var loadErrs []error // guarded by mu
	g, rdb := newGuard(t, s, cacheguard.Observer(func(_ context.Context, e cacheguard.Event) {
		if e.Kind == cacheguard.EventLoad {
			mu.Lock()
			loadErrs = append(loadErrs, e.Err)
			mu.Unlock()
		}
	}))
	const requests = 50
	big := strings.Repeat("0123456789abcdef", 16<<10) // 256 KiB
	var calls atomic.Int64
	release := make(chan struct{})
	r := newEngine()
	r.GET("/list", ginmw.Cache(g, time.Minute, ginmw.MaxBody(64<<10)), func(c *gin.Context) {
		calls.Add(1)
		<-release
		c.String(http.StatusOK, big)
	})
	ws := make([]*httptest.ResponseRecorder, requests)
	var wg sync.WaitGroup
	for i := range requests {
		wg.Go(func() { ws[i] = serve(r, http.MethodGet, "/list") })
	}
	eventually(t, 30*time.Second, "all requests to miss", func() bool { return totalMisses(g) == requests })
	close(release)
	wg.Wait()

	xcache := map[string]int{}
	for i, w := range ws {
		if w.Code != http.StatusOK || w.Body.String() != big {
			t.Fatalf("request %d: %d, %d bytes", i, w.Code, w.Body.Len())
		}
		xcache[w.Header().Get("X-Cache")]++
	}
	if calls.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", calls.Load())
	}
	if xcache["MISS"] != 1 || xcache["COALESCED"] != requests-1 {
		t.Errorf("X-Cache %v, want 1 MISS and %d COALESCED", xcache, requests-1)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(loadErrs) != 1 || !errors.Is(loadErrs[0], cacheguard.ErrUncached) {
		t.Errorf("loads reported %v, want one, an answer not stored (cacheguard.ErrUncached)", loadErrs)
	}
	if n, err := storedEntries(rdb); err != nil || n != 0 {
		t.Fatalf("%d stored entries (%v), want 0", n, err)
	}
}

// The host is part of the key: two virtual hosts served by one engine never
// share an entry for the same path.
func TestCacheKeyIncludesHost(t *testing.T) {
	g, rdb := startGuard(t)
	r := newEngine()
	r.GET("/home", ginmw.Cache(g, time.Minute), func(c *gin.Context) { c.String(http.StatusOK, "tenant "+c.Request.Host) })
	if w := serve(r, http.MethodGet, "http://a.example/home"); w.Body.String() != "tenant a.example" {
		t.Fatalf("a: %q", w.Body)
	}
	waitEntries(t, rdb, 1)
	if w := serve(r, http.MethodGet, "http://b.example/home"); w.Body.String() != "tenant b.example" || w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("b: %q, X-Cache %q", w.Body, w.Header().Get("X-Cache"))
	}
	// The host name counts, not its case nor the port (the processes of one
	// service may each listen on their own).
	for _, host := range []string{"A.EXAMPLE", "a.example:8080"} {
		if w := serve(r, http.MethodGet, "http://"+host+"/home"); w.Body.String() != "tenant a.example" || w.Header().Get("X-Cache") != "HIT" {
			t.Fatalf("%s: %q, X-Cache %q", host, w.Body, w.Header().Get("X-Cache"))
		}
	}
	if w := serve(r, http.MethodGet, "http://[::1]:8080/home"); w.Body.String() != "tenant [::1]:8080" || w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("[::1]:8080: %q, X-Cache %q", w.Body, w.Header().Get("X-Cache"))
	}
	waitEntries(t, rdb, 3)
	if w := serve(r, http.MethodGet, "http://[::1]/home"); w.Body.String() != "tenant [::1]:8080" || w.Header().Get("X-Cache") != "HIT" {
		t.Fatalf("[::1]: %q, X-Cache %q", w.Body, w.Header().Get("X-Cache"))
	}
}

// A response one process does not store (it sets a cookie) is no failure for
// the requests of another process that waited for its load: they run their
// own handler (BYPASS), as that process's own waiting requests do, and record
// no error (they were told the load failed: cacheguard.ErrRemoteLoad, which
// ginmw.ErrorFor answers 503).
func TestCacheUncachedAnswerInAnotherProcess(t *testing.T) {
	s := redistest.Start(t)
	ga, _ := newGuard(t, s)
	rdbB := s.Client()
	waiting := watchWaiting(rdbB)
	gb := cacheguard.New(rdbB)
	t.Cleanup(func() { gb.Close() })
	var errs []error
	var calls atomic.Int64
	gate := make(chan struct{})
	started := make(chan struct{})
	page := func(c *gin.Context) {
		if calls.Add(1) == 1 {
			close(started)
			<-gate
		}
		c.SetCookie("session", "abc", 60, "/", "", false, true)
		c.String(http.StatusOK, "hi")
	}
	a, b := newEngine(), newEngine()
	recordErrors(b, &errs)
	a.GET("/p", ginmw.Cache(ga, time.Minute), page)
	b.GET("/p", ginmw.Cache(gb, time.Minute), page)
	aDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { aDone <- serve(a, http.MethodGet, "/p") }()
	<-started
	bDone := make(chan *httptest.ResponseRecorder, 1)
	go func() { bDone <- serve(b, http.MethodGet, "/p") }()
	<-waiting
	close(gate)
	if w := <-aDone; w.Code != http.StatusOK || w.Header().Get("X-Cache") != "MISS" {
		t.Fatalf("A: %d, X-Cache %q", w.Code, w.Header().Get("X-Cache"))
	}
	w := <-bDone
	if w.Code != http.StatusOK || w.Body.String() != "hi" || w.Header().Get("X-Cache") != "BYPASS" || calls.Load() != 2 {
		t.Errorf("B, waiting for A's uncached answer: %d %q, X-Cache %q, handler ran %d times; want its own 200, BYPASS, 2",
			w.Code, w.Body, w.Header().Get("X-Cache"), calls.Load())
	}
	if len(errs) != 0 {
		t.Errorf("B recorded %v: an answer not stored is no error", errs)
	}
}
