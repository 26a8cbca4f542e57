package ginmw_test

import (
	"context"
	"net/http"
	"strconv"
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

// lockerKind builds a Locker of one kind on servers of the test's own, with
// a way to take the servers down.
type lockerKind struct {
	name string
	new  func(t *testing.T) (l lockerUnderTest, down func())
}

// lockerUnderTest is what these tests need of a Locker: Lock's surface and a
// way to hold a name for the test.
type lockerUnderTest interface {
	locks.Locker
	Close() error
}

// noRetries: the tests are about answers, not go-redis's backoff.
func noRetries(o *redis.Options) { o.MaxRetries = -1; o.DialTimeout = 200 * time.Millisecond }

var lockerKinds = []lockerKind{
	{"Client", func(t *testing.T) (lockerUnderTest, func()) {
		s := redistest.Start(t)
		l := locks.New(s.Client(noRetries))
		t.Cleanup(func() { l.Close() })
		return l, func() { s.Kill() }
	}},
	{"Redlock", func(t *testing.T) (lockerUnderTest, func()) {
		servers := redistest.StartN(t, 3)
		clients := make([]redis.UniversalClient, len(servers))
		for i, s := range servers {
			clients[i] = s.Client(noRetries)
		}
		l := locks.NewRedlock(clients)
		t.Cleanup(func() { l.Close() })
		return l, func() {
			for _, s := range servers {
				s.Kill()
			}
		}
	}},
}

// holdWith takes name on l for the test, released at cleanup.
func holdWith(t *testing.T, l locks.Locker, name string) {
	t.Helper()
	lk, err := l.TryLock(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lk.Unlock(context.Background()) })
}

// Every Locker's failures are classified alike: contention answers 409 with
// Retry-After (FailOpen or not: contention never runs the handler), Redis
// unavailable answers 503 (FailOpen runs the handler unlocked), and the lock
// excludes concurrent requests and is released when the handler panics.
func TestLockEveryLocker(t *testing.T) {
	for _, kind := range lockerKinds {
		t.Run(kind.name, func(t *testing.T) {
			l, down := kind.new(t)
			var ran atomic.Int64
			handler := func(c *gin.Context) { ran.Add(1); c.Status(http.StatusOK) }
			r := newEngine()
			r.PUT("/closed/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(50*time.Millisecond))), handler)
			r.PUT("/open/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(50*time.Millisecond)), ginmw.FailOpen()), handler)
			r.PUT("/locked/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0)), ginmw.ConflictStatus(http.StatusLocked)), handler)
			var inside, overlaps atomic.Int64
			r.PUT("/serial/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(time.Minute))), func(c *gin.Context) {
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				time.Sleep(time.Millisecond) // widen the critical section
				inside.Add(-1)
				c.Status(http.StatusNoContent)
			})
			var panics atomic.Int64
			r.PUT("/panic/:id", ginmw.Lock(l, repoKey, ginmw.LockOptions(locks.WaitBudget(0))), func(c *gin.Context) {
				if panics.Add(1) == 1 {
					panic("boom")
				}
				c.Status(http.StatusOK)
			})

			// Contention.
			holdWith(t, l, "repos:1")
			for _, tc := range []struct {
				path string
				want int
			}{{"/closed/1", http.StatusConflict}, {"/open/1", http.StatusConflict}, {"/locked/1", http.StatusLocked}} {
				w := serve(r, http.MethodPut, tc.path)
				if w.Code != tc.want {
					t.Fatalf("%s held elsewhere: status %d, want %d (%s)", tc.path, w.Code, tc.want, w.Body)
				}
				if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 {
					t.Fatalf("%s: Retry-After %q", tc.path, w.Header().Get("Retry-After"))
				}
				if b := decodeError(t, w); b.Resource != "repos:1" || b.Error != "resource locked" {
					t.Fatalf("%s: body %+v", tc.path, b)
				}
			}
			if ran.Load() != 0 {
				t.Fatalf("the handler ran %d times while another owner held the resource", ran.Load())
			}

			// Mutual exclusion.
			const n = 20
			var wg sync.WaitGroup
			codes := make([]int, n)
			for i := range n {
				wg.Go(func() { codes[i] = serve(r, http.MethodPut, "/serial/2").Code })
			}
			wg.Wait()
			for i, code := range codes {
				if code != http.StatusNoContent {
					t.Fatalf("serial request %d: status %d", i, code)
				}
			}
			if overlaps.Load() != 0 {
				t.Fatalf("%d overlaps in the handler", overlaps.Load())
			}

			// A panicking handler releases the lock.
			if w := serve(r, http.MethodPut, "/panic/3"); w.Code != http.StatusInternalServerError {
				t.Fatalf("panicking request: status %d", w.Code)
			}
			if w := serve(r, http.MethodPut, "/panic/3"); w.Code != http.StatusOK {
				t.Fatalf("after the panic: status %d, want 200 (the lock was released)", w.Code)
			}

			// Redis unavailable.
			down()
			if w := serve(r, http.MethodPut, "/closed/4"); w.Code != http.StatusServiceUnavailable {
				t.Fatalf("Redis down: status %d, want 503 (%s)", w.Code, w.Body)
			} else if b := decodeError(t, w); b.Error != "service unavailable" {
				t.Fatalf("Redis down: body %+v", b)
			}
			if ran.Load() != 0 {
				t.Fatal("the handler ran without the lock")
			}
			if w := serve(r, http.MethodPut, "/open/4"); w.Code != http.StatusOK || ran.Load() != 1 {
				t.Fatalf("Redis down, FailOpen: status %d, handler ran %d times; want it run unlocked", w.Code, ran.Load())
			}
		})
	}
}
