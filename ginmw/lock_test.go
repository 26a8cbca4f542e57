package ginmw_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/ginmw"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

var repoKey = ginmw.Resource("repos", ginmw.Param("id"))

// A nested acquisition of the same resource inside the handler (what
// gormplugin's row guard does for a write to repos/42) re-enters the lock the
// middleware holds: it returns at once, with the same fence, on one Redis key
// whose hold count is 2.
func TestLockReentersNestedAcquisition(t *testing.T) {
	l, rdb, _ := newLocker(t)
	r := newEngine()
	var (
		innerErr       error
		holds          string
		keys           []string
		outerF, innerF uint64
		fenceOK        bool
		afterInner     string
	)
	r.PUT("/repos/:id/settings", ginmw.Lock(l, repoKey), func(c *gin.Context) {
		ctx := c.Request.Context()
		outerF, fenceOK = ginmw.Fence(c)
		// WaitBudget(0): if this did not re-enter it would fail at once instead of waiting.
		inner, err := l.Lock(ctx, "repos:42", locks.WaitBudget(0))
		if err != nil {
			innerErr = err
			c.Status(http.StatusInternalServerError)
			return
		}
		innerF = inner.Fence()
		holds, _ = rdb.HGet(ctx, "cg:lock:{repos:42}", "n").Result()
		keys, _ = rdb.Keys(ctx, "cg:lock:*").Result()
		innerErr = inner.Unlock(ctx)
		afterInner, _ = rdb.HGet(ctx, "cg:lock:{repos:42}", "n").Result()
		c.Status(http.StatusNoContent)
	})

	w := serve(r, http.MethodPut, "/repos/42/settings")
	if innerErr != nil {
		t.Fatalf("nested Lock: %v", innerErr)
	}
	if w.Code != http.StatusNoContent {
		t.Fatalf("status %d", w.Code)
	}
	if holds != "2" {
		t.Fatalf("hold count inside the nested acquisition = %q, want 2", holds)
	}
	if len(keys) != 1 || keys[0] != "cg:lock:{repos:42}" {
		t.Fatalf("lock keys %v, want only cg:lock:{repos:42}", keys)
	}
	if afterInner != "1" {
		t.Fatalf("hold count after the nested Unlock = %q, want 1", afterInner)
	}
	if !fenceOK || outerF == 0 || innerF != outerF {
		t.Fatalf("fences: middleware %d (ok %v), nested %d", outerF, fenceOK, innerF)
	}
	if lockExists(t, rdb, "repos:42") {
		t.Fatal("lock still held after the request")
	}
}

// An owner already on the request context is kept, so two Lock middlewares on
// the same resource in one chain re-enter instead of deadlocking.
func TestLockKeepsOwnerFromContext(t *testing.T) {
	l, rdb, _ := newLocker(t)
	r := newEngine()
	r.Use(func(c *gin.Context) {
		c.Request = c.Request.WithContext(locks.WithOwner(c.Request.Context(), "job-7"))
	})
	var holds, owner string
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey), ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0))), func(c *gin.Context) {
		ctx := c.Request.Context()
		holds, _ = rdb.HGet(ctx, "cg:lock:{repos:1}", "n").Result()
		owner, _ = rdb.HGet(ctx, "cg:lock:{repos:1}", "o").Result()
	})
	if w := serve(r, http.MethodPut, "/repos/1"); w.Code != http.StatusOK {
		t.Fatalf("status %d: %s", w.Code, w.Body)
	}
	if holds != "2" || owner != "job-7" {
		t.Fatalf("holds %q owner %q, want 2 and job-7", holds, owner)
	}
}

// 50 concurrent PUTs on one resource never overlap inside the handler.
func TestLockExcludesConcurrentRequests(t *testing.T) {
	l, _, _ := newLocker(t)
	r := newEngine()
	var inside, overlaps, ran atomic.Int64
	r.PUT("/repos/:id/settings", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(time.Minute))), func(c *gin.Context) {
		if inside.Add(1) != 1 {
			overlaps.Add(1)
		}
		for range 20 { // widen the critical section
			runtime.Gosched()
		}
		time.Sleep(100 * time.Microsecond)
		inside.Add(-1)
		ran.Add(1)
		c.Status(http.StatusNoContent)
	})

	const n = 50
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { codes[i] = serve(r, http.MethodPut, "/repos/7/settings").Code })
	}
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusNoContent {
			t.Fatalf("request %d: status %d", i, code)
		}
	}
	if overlaps.Load() != 0 {
		t.Fatalf("%d overlaps in the handler", overlaps.Load())
	}
	wantCalls(t, &ran, n)
}

// Requests on different resources hold their locks at the same time: every
// handler waits at a barrier that opens only once all of them are inside.
func TestLockDifferentResourcesRunInParallel(t *testing.T) {
	l, _, _ := newLocker(t)
	r := newEngine()
	const n = 8
	var arrived atomic.Int64
	all := make(chan struct{})
	r.PUT("/repos/:id/settings", ginmw.Lock(l, repoKey), func(c *gin.Context) {
		if arrived.Add(1) == n {
			close(all)
		}
		select {
		case <-all:
			c.Status(http.StatusNoContent)
		case <-time.After(20 * time.Second):
			c.Status(http.StatusGatewayTimeout) // the handlers were serialised
		}
	})
	codes := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { codes[i] = serve(r, http.MethodPut, fmt.Sprintf("/repos/%d/settings", i)).Code })
	}
	wg.Wait()
	for i, code := range codes {
		if code != http.StatusNoContent {
			t.Fatalf("request %d: status %d (handlers did not run in parallel)", i, code)
		}
	}
}

// When the wait budget runs out the request is refused with 409, Retry-After
// and a JSON body naming the resource, and the handler does not run.
func TestLockConflictAfterWaitBudget(t *testing.T) {
	l, _, _ := newLocker(t)
	hold(t, l, "repos:9")

	var ran atomic.Bool
	handler := func(c *gin.Context) { ran.Store(true) }
	r := newEngine()
	r.PUT("/wait/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(50*time.Millisecond))), handler)
	r.PUT("/now/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0))), handler)
	r.PUT("/locked/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0)), ginmw.ConflictStatus(http.StatusLocked)), handler)

	for _, tc := range []struct {
		path string
		want int
	}{
		{"/wait/9", http.StatusConflict},
		{"/now/9", http.StatusConflict},
		{"/locked/9", http.StatusLocked},
	} {
		w := serve(r, http.MethodPut, tc.path)
		if w.Code != tc.want {
			t.Fatalf("%s: status %d, want %d", tc.path, w.Code, tc.want)
		}
		ra, err := strconv.Atoi(w.Header().Get("Retry-After"))
		if err != nil || ra < 1 || ra > 10 {
			t.Fatalf("%s: Retry-After %q, want 1..10 seconds (the holder's lease)", tc.path, w.Header().Get("Retry-After"))
		}
		b := decodeError(t, w)
		if b.Resource != "repos:9" || b.Error != "resource locked" || b.RetryAfter != ra {
			t.Fatalf("%s: body %+v", tc.path, b)
		}
	}
	if ran.Load() {
		t.Fatal("the handler ran without the lock")
	}
}

// A deadline set by an earlier middleware ends the wait as contention does.
func TestLockUpstreamDeadlineIsConflict(t *testing.T) {
	l, _, _ := newLocker(t)
	hold(t, l, "repos:10")
	r := newEngine()
	r.Use(func(c *gin.Context) {
		ctx, cancel := context.WithTimeout(c.Request.Context(), 50*time.Millisecond)
		defer cancel()
		c.Request = c.Request.WithContext(ctx)
		c.Next()
	})
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey), func(c *gin.Context) { c.Status(http.StatusOK) })
	w := serve(r, http.MethodPut, "/repos/10")
	if w.Code != http.StatusConflict || w.Header().Get("Retry-After") == "" {
		t.Fatalf("status %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
}

// A panicking handler releases the lock, the panic still reaches Gin's
// recovery, and the next request gets the lock at once.
func TestLockReleasedWhenHandlerPanics(t *testing.T) {
	l, rdb, _ := newLocker(t)
	r := newEngine()
	var calls atomic.Int64
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0))), func(c *gin.Context) {
		if calls.Add(1) == 1 {
			panic("boom")
		}
		c.Status(http.StatusOK)
	})
	if w := serve(r, http.MethodPut, "/repos/3"); w.Code != http.StatusInternalServerError {
		t.Fatalf("panicking request: status %d, want 500 from the recovery", w.Code)
	}
	if lockExists(t, rdb, "repos:3") {
		t.Fatal("lock still held after the handler panicked")
	}
	if w := serve(r, http.MethodPut, "/repos/3"); w.Code != http.StatusOK {
		t.Fatalf("next request: status %d", w.Code)
	}
}

// A client that disconnects mid-handler cancels the handler's context (cause:
// the client, not a lost lock), and the lock is released although the
// request's context is already cancelled.
func TestLockReleasedWhenClientDisconnects(t *testing.T) {
	l, rdb, _ := newLocker(t)
	entered := make(chan struct{})
	finished := make(chan struct{})
	var cause error
	r := newEngine()
	r.Use(func(c *gin.Context) {
		c.Next() // Lock has released when this returns
		close(finished)
	})
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey), func(c *gin.Context) {
		close(entered)
		<-c.Request.Context().Done()
		cause = context.Cause(c.Request.Context())
	})
	cancel, errc := startRequest(t, r, http.MethodPut, "/repos/4")
	within(t, 10*time.Second, entered, "the handler")
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("client: %v", err)
	}
	within(t, 10*time.Second, finished, "the request to finish after the disconnect")
	if !errors.Is(cause, context.Canceled) || errors.Is(cause, locks.ErrLost) {
		t.Fatalf("handler context cause %v, want the client's cancellation", cause)
	}
	if lockExists(t, rdb, "repos:4") {
		t.Fatal("lock still held after the client disconnected")
	}
}

// A client that disconnects while waiting for the lock aborts the request
// (499) without running the handler, and leaves the holder's lock alone.
func TestLockClientGivesUpWhileWaiting(t *testing.T) {
	l, rdb, _ := newLocker(t)
	holder := hold(t, l, "repos:6")
	status := make(chan int, 1)
	var ran atomic.Bool
	r := newEngine()
	r.Use(func(c *gin.Context) {
		c.Next()
		status <- c.Writer.Status()
	})
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(time.Minute))), func(c *gin.Context) { ran.Store(true) })
	cancel, errc := startRequest(t, r, http.MethodPut, "/repos/6")
	// The request is waiting once it has a place in the lock's queue.
	eventually(t, 10*time.Second, "the request to queue for the lock", func() bool {
		n, _ := rdb.ZCard(context.Background(), "cg:q:{repos:6}").Result()
		return n == 1
	})
	cancel()
	<-errc
	select {
	case got := <-status:
		if got != ginmw.StatusClientClosedRequest {
			t.Fatalf("status %d, want 499", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("request still waiting after the client went away")
	}
	if ran.Load() {
		t.Fatal("handler ran")
	}
	if !lockExists(t, rdb, "repos:6") || holder.TTL() == 0 {
		t.Fatal("the holder's lock was disturbed")
	}
}

// With Redis down, Lock fails closed with 503; FailOpen runs the handler
// without a lock (and without a fence).
func TestLockRedisUnavailable(t *testing.T) {
	s := redistest.Start(t)
	// No retries: the test is about the answer, not go-redis's backoff.
	l := locks.New(s.Client(func(o *redis.Options) { o.MaxRetries = -1 }))
	t.Cleanup(func() { l.Close() })
	var ran atomic.Int64
	var fenced atomic.Bool
	handler := func(c *gin.Context) {
		ran.Add(1)
		_, ok := ginmw.Fence(c)
		fenced.Store(ok)
		c.Status(http.StatusOK)
	}
	var recorded []error
	r := newEngine()
	recordErrors(r, &recorded)
	r.PUT("/closed/:id", ginmw.Lock(l, repoKey), handler)
	r.PUT("/open/:id", ginmw.Lock(l, repoKey, ginmw.FailOpen()), handler)
	s.Kill()

	w := serve(r, http.MethodPut, "/closed/8")
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503", w.Code)
	}
	if b := decodeError(t, w); b.Error != "service unavailable" || b.Resource != "repos:8" {
		t.Fatalf("body %+v", b)
	}
	if ran.Load() != 0 {
		t.Fatal("handler ran without the lock")
	}

	recorded = nil
	if w := serve(r, http.MethodPut, "/open/8"); w.Code != http.StatusOK {
		t.Fatalf("fail-open: status %d, want 200", w.Code)
	}
	if ran.Load() != 1 || fenced.Load() {
		t.Fatalf("fail-open: handler ran %d times, fence reported %v", ran.Load(), fenced.Load())
	}
	if len(recorded) != 1 || !errors.Is(recorded[0], locks.ErrUnavailable) {
		t.Fatalf("fail-open: recorded errors %v, want one locks.ErrUnavailable", recorded)
	}
}

// A lock lost mid-handler (its key deleted, so renewal finds another owner)
// cancels the request's context with cause locks.ErrLost.
func TestLockLostCancelsRequestContext(t *testing.T) {
	l, rdb, _ := newLocker(t)
	entered := make(chan struct{})
	var cause error
	var recorded []error
	r := newEngine()
	recordErrors(r, &recorded)
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.Lease(150*time.Millisecond))), func(c *gin.Context) {
		close(entered)
		select {
		case <-c.Request.Context().Done():
			cause = context.Cause(c.Request.Context())
			c.Status(http.StatusConflict)
		case <-time.After(20 * time.Second):
			c.Status(http.StatusOK)
		}
	})
	w := serveLosingLock(t, r, rdb, entered)
	if w.Code != http.StatusConflict || !errors.Is(cause, locks.ErrLost) {
		t.Fatalf("status %d, context cause %v; want the context cancelled with locks.ErrLost", w.Code, cause)
	}
	if len(recorded) != 1 || !errors.Is(recorded[0], locks.ErrLost) {
		t.Fatalf("recorded errors %v, want locks.ErrLost", recorded)
	}
}

// Methods locks only the listed methods: a GET passes a held resource.
func TestLockOnlySomeMethods(t *testing.T) {
	l, _, _ := newLocker(t)
	hold(t, l, "repos:11")
	r := newEngine()
	r.Use(ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0)), ginmw.Methods("put", "DELETE")))
	var fenced atomic.Bool
	h := func(c *gin.Context) {
		_, ok := ginmw.Fence(c)
		fenced.Store(ok)
		c.Status(http.StatusOK)
	}
	r.GET("/repos/:id", h)
	r.PUT("/repos/:id", h)
	if w := serve(r, http.MethodGet, "/repos/11"); w.Code != http.StatusOK || fenced.Load() {
		t.Fatalf("GET: status %d, fenced %v; want 200 unlocked", w.Code, fenced.Load())
	}
	if w := serve(r, http.MethodPut, "/repos/11"); w.Code != http.StatusConflict {
		t.Fatalf("PUT: status %d, want 409", w.Code)
	}
}

// Without Resource the route's full path scopes the lock name, so two routes
// that share a parameter name never collide.
func TestLockRouteScopesName(t *testing.T) {
	l, _, _ := newLocker(t)
	r := newEngine()
	names := make(chan string, 2)
	h := func(c *gin.Context) {
		lk, _ := ginmw.LockFromContext(c.Request.Context())
		names <- lk.Name()
	}
	r.PUT("/repos/:id", ginmw.Lock(l, ginmw.Param("id"), ginmw.LockOptions(locks.WaitBudget(0))), h)
	r.PUT("/orgs/:id", ginmw.Lock(l, ginmw.Param("id"), ginmw.LockOptions(locks.WaitBudget(0))), h)
	hold(t, l, "/repos/:id:1")
	if w := serve(r, http.MethodPut, "/repos/1"); w.Code != http.StatusConflict {
		t.Fatalf("/repos/1: status %d, want 409", w.Code)
	}
	if w := serve(r, http.MethodPut, "/orgs/1"); w.Code != http.StatusOK {
		t.Fatalf("/orgs/1: status %d, want 200", w.Code)
	}
	if got := <-names; got != "/orgs/:id:1" {
		t.Fatalf("lock name %q", got)
	}
}

// Bad keys are refused with 400 and a JSON body that says what is missing.
func TestLockBadKey(t *testing.T) {
	l, _, _ := newLocker(t)
	r := newEngine()
	var ran atomic.Bool
	h := func(c *gin.Context) { ran.Store(true) }
	errTenant := errors.New("tenant must be numeric")
	r.PUT("/header", ginmw.Lock(l, ginmw.Header("X-Tenant")), h)
	r.PUT("/query", ginmw.Lock(l, ginmw.Resource("tenants", ginmw.Query("tenant"))), h)
	r.PUT("/func", ginmw.Lock(l, ginmw.Func(func(c *gin.Context) (string, error) { return "", errTenant })), h)
	r.PUT("/empty", ginmw.Lock(l, ginmw.Func(func(c *gin.Context) (string, error) { return "", nil })), h)
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey), h)
	for _, tc := range []struct{ target, want string }{
		{"/header", `bad key: header "X-Tenant" is missing`},
		{"/query?other=1", `bad key: query parameter "tenant" is missing`},
		{"/func", "bad key: tenant must be numeric"},
		{"/empty", "bad key: empty key"},
		{"/repos/" + strings.Repeat("x", ginmw.MaxKeyLen+1), fmt.Sprintf("bad key: key of %d bytes exceeds %d", ginmw.MaxKeyLen+1, ginmw.MaxKeyLen)},
	} {
		w := serve(r, http.MethodPut, tc.target)
		if w.Code != http.StatusBadRequest {
			t.Fatalf("%s: status %d", tc.target, w.Code)
		}
		if b := decodeError(t, w); b.Error != tc.want {
			t.Fatalf("%s: error %q, want %q", tc.target, b.Error, tc.want)
		}
	}
	if ran.Load() {
		t.Fatal("handler ran")
	}
	// Valid keys of every extractor.
	r2 := newEngine()
	r2.PUT("/header", ginmw.Lock(l, ginmw.Header("X-Tenant")), h)
	r2.PUT("/query", ginmw.Lock(l, ginmw.Resource("tenants", ginmw.Query("tenant"))), h)
	names := make(chan string, 1)
	r2.Use()
	r2.PUT("/repos/:id", ginmw.Lock(l, repoKey), func(c *gin.Context) {
		lk, _ := ginmw.LockFromContext(c.Request.Context())
		names <- lk.Name()
	})
	if w := serve(r2, http.MethodPut, "/header", "X-Tenant", "acme"); w.Code != http.StatusOK {
		t.Fatalf("header: status %d", w.Code)
	}
	if w := serve(r2, http.MethodPut, "/query?tenant=acme"); w.Code != http.StatusOK {
		t.Fatalf("query: status %d", w.Code)
	}
	if w := serve(r2, http.MethodPut, "/repos/"+strings.Repeat("x", ginmw.MaxKeyLen)); w.Code != http.StatusOK {
		t.Fatalf("longest key: status %d", w.Code)
	}
	if got := <-names; got != "repos:"+strings.Repeat("x", ginmw.MaxKeyLen) {
		t.Fatalf("name %q", got)
	}
}

// A custom ErrorHandler receives the refusal as an *Error that matches its
// kind and cause.
func TestLockErrorHandler(t *testing.T) {
	l, _, _ := newLocker(t)
	hold(t, l, "repos:12")
	var got *ginmw.Error
	r := newEngine()
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0)), ginmw.ErrorHandler(func(c *gin.Context, e *ginmw.Error) {
		got = e
		c.AbortWithStatus(http.StatusTeapot)
	})), func(c *gin.Context) {})
	w := serve(r, http.MethodPut, "/repos/12")
	if w.Code != http.StatusTeapot || got == nil {
		t.Fatalf("status %d, error %v", w.Code, got)
	}
	if !errors.Is(got, ginmw.ErrLocked) || !errors.Is(got, locks.ErrNotObtained) || got.Resource != "repos:12" || got.Status != http.StatusConflict {
		t.Fatalf("error %#v", got)
	}
	if w.Header().Get("Retry-After") == "" {
		t.Fatal("Retry-After not set for a custom handler")
	}
}

// The request context carries the lock: fences increase from one request to
// the next, and the context has the lock's owner.
func TestLockFenceOnContext(t *testing.T) {
	l, _, _ := newLocker(t)
	r := newEngine()
	type seen struct {
		fence, fromCtx uint64
		ok             bool
		owner          string
	}
	out := make(chan seen, 2)
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey), func(c *gin.Context) {
		var s seen
		s.fence, s.ok = ginmw.Fence(c)
		s.fromCtx, _ = ginmw.Fence(c.Request.Context())
		s.owner, _ = locks.OwnerFrom(c.Request.Context())
		out <- s
	})
	serve(r, http.MethodPut, "/repos/13")
	serve(r, http.MethodPut, "/repos/13")
	a, b := <-out, <-out
	if !a.ok || !b.ok || a.fence == 0 || b.fence <= a.fence || a.fromCtx != a.fence {
		t.Fatalf("fences %+v then %+v", a, b)
	}
	if a.owner == "" || a.owner == b.owner {
		t.Fatalf("owners %q and %q, want one per request", a.owner, b.owner)
	}
	if _, ok := ginmw.Fence(context.Background()); ok {
		t.Fatal("fence on a bare context")
	}
}

// Issue 45 item 5: an ErrorHandler that answers without aborting does not let
// the handler run unlocked — for contention, a bad key and an outage alike.
func TestLockErrorHandlerWithoutAbortStillAborts(t *testing.T) {
	l, _, s := newLocker(t)
	hold(t, l, "repos:12")
	var ran atomic.Int64
	answer := ginmw.ErrorHandler(func(c *gin.Context, e *ginmw.Error) {
		c.String(e.Status, "refused") // no Abort
	})
	r := newEngine()
	r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0)), answer), func(c *gin.Context) { ran.Add(1) })
	r.PUT("/bad/:id", ginmw.Lock(l, ginmw.Resource("repos", ginmw.Int(ginmw.Param("id"))), answer), func(c *gin.Context) { ran.Add(1) })
	if w := serve(r, http.MethodPut, "/repos/12"); w.Code != http.StatusConflict {
		t.Errorf("contention: status %d", w.Code)
	}
	if w := serve(r, http.MethodPut, "/bad/x"); w.Code != http.StatusNotFound {
		t.Errorf("bad key: status %d", w.Code)
	}
	s.Kill()
	if w := serve(r, http.MethodPut, "/repos/13"); w.Code != http.StatusServiceUnavailable {
		t.Errorf("outage: status %d", w.Code)
	}
	wantCalls(t, &ran, 0)
}

// TestLockLostAboveIsNotClientGone (found by TestGenLock): when a Lock
// further up the chain loses its lock, the request's context ends (cause
// locks.ErrLost) while its client is still there. A nested Lock waiting then,
// and a handler that Aborts with the context.Canceled its call returned,
// answer that loss (409 "lock lost"), not 499 as for a client gone.
func TestLockLostAboveIsNotClientGone(t *testing.T) {
	for _, tc := range []struct {
		name  string
		inner func(l *locks.Client, entered chan<- struct{}) gin.HandlerFunc
	}{
		{"nested Lock waiting", func(l *locks.Client, entered chan<- struct{}) gin.HandlerFunc {
			other := ginmw.Lock(l, ginmw.Resource("owners", ginmw.Param("id")), ginmw.LockOptions(locks.WaitBudget(20*time.Second)))
			return func(c *gin.Context) {
				close(entered)
				other(c) // held by another owner: waits until the outer lock is lost
			}
		}},
		{"Abort(context.Canceled)", func(_ *locks.Client, entered chan<- struct{}) gin.HandlerFunc {
			return func(c *gin.Context) {
				close(entered)
				select {
				case <-c.Request.Context().Done():
					ginmw.Abort(c, c.Request.Context().Err()) // as a query cut by the context returns it
				case <-time.After(20 * time.Second):
					c.Status(http.StatusOK)
				}
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, rdb, _ := newLocker(t)
			hold(t, l, "owners:5")
			entered := make(chan struct{})
			r := newEngine()
			r.PUT("/repos/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.Lease(150*time.Millisecond))), tc.inner(l, entered),
				func(c *gin.Context) { c.Status(http.StatusOK) })
			w := serveLosingLock(t, r, rdb, entered)
			if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "lock lost") {
				t.Fatalf("answered %d %q; want 409 lock lost: the client is still there", w.Code, w.Body.String())
			}
		})
	}
}

// serveLosingLock serves PUT /repos/5 on r and, once entered is closed (the
// chain runs under the lock), deletes the lock's key so that its renewal
// finds it gone and the lock is lost; it returns the answer.
func serveLosingLock(t *testing.T, r http.Handler, rdb *redis.Client, entered <-chan struct{}) *httptest.ResponseRecorder {
	t.Helper()
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- serve(r, http.MethodPut, "/repos/5") }()
	within(t, 10*time.Second, entered, "the handler")
	if err := rdb.Del(context.Background(), "cg:lock:{repos:5}").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case w := <-done:
		return w
	case <-time.After(30 * time.Second):
		t.Fatal("request never finished")
		return nil
	}
}

// A key that fits MaxKeyLen but not the room a long route leaves in a lock
// name is a bad key (400), not a Redis refusal answered 500 (outside probe).
func TestLockKeyPastItsScopesRoomIsBad(t *testing.T) {
	l, _, _ := newLocker(t)
	var ran atomic.Int64
	r := newEngine()
	route := "/" + strings.Repeat("x", 800) + "/:id"
	r.PUT(route, ginmw.Lock(l, ginmw.Param("id")), func(c *gin.Context) { ran.Add(1); c.Status(http.StatusNoContent) })
	w := serve(r, http.MethodPut, "/"+strings.Repeat("x", 800)+"/"+strings.Repeat("7", ginmw.MaxKeyLen))
	if w.Code != http.StatusBadRequest || ran.Load() != 0 {
		t.Fatalf("status %d body %s, handler ran %d times: want a bad key (400)", w.Code, w.Body, ran.Load())
	}
}
