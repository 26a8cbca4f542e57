package locks_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

func newClient(t *testing.T, opts ...locks.Option) (*locks.Client, *redis.Client, *redistest.Server) {
	t.Helper()
	s := redistest.Start(t)
	rdb := s.Client()
	c := locks.New(rdb, opts...)
	t.Cleanup(func() { c.Close() })
	return c, rdb, s
}

func TestLockUnlock(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	lk, err := c.TryLock(ctx, "repo:42")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(ctx, "repo:42"); !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("second TryLock: %v, want ErrNotObtained", err)
	}
	var noe *locks.NotObtainedError
	if _, err := c.TryLock(ctx, "repo:42"); !errors.As(err, &noe) || noe.RetryAfter <= 0 {
		t.Fatalf("want a NotObtainedError with RetryAfter, got %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	if n, _ := rdb.Exists(ctx, "cg:lock:{repo:42}").Result(); n != 0 {
		t.Fatal("lock key left after Unlock")
	}
	lk2, err := c.TryLock(ctx, "repo:42")
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Fence() <= lk.Fence() {
		t.Fatalf("fence %d not above %d", lk2.Fence(), lk.Fence())
	}
	lk2.Unlock(ctx)
}

func TestLockWaitsForHandOff(t *testing.T) {
	ctx := context.Background()
	c, _, _ := newClient(t)
	const n = 8
	var mu sync.Mutex
	inside := 0
	var wg sync.WaitGroup
	errs := make(chan error, n*20)
	for range n {
		wg.Go(func() {
			for range 20 {
				lk, err := c.Lock(ctx, "hot")
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				inside++
				if inside != 1 {
					errs <- errors.New("two holders")
				}
				mu.Unlock()
				time.Sleep(100 * time.Microsecond)
				mu.Lock()
				inside--
				mu.Unlock()
				if err := lk.Unlock(ctx); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestContextKeepsValues: Lock.Context carries the acquiring call's values
// (request ids, trace spans) but not its cancellation, and ends with the lock.
func TestContextKeepsValues(t *testing.T) {
	c, _, _ := newClient(t)
	type key struct{}
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), key{}, "request-7"))
	lk, err := c.Lock(ctx, "values")
	if err != nil {
		t.Fatal(err)
	}
	lctx := lk.Context()
	if v, _ := lctx.Value(key{}).(string); v != "request-7" {
		t.Fatalf("Context().Value = %q, want the caller's value", v)
	}
	cancel()
	if lctx.Err() != nil {
		t.Fatal("the caller's cancellation ended the lock's context")
	}
	if err := lk.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(lctx.Err(), context.Canceled) {
		t.Fatalf("after Unlock: Context().Err() = %v, want context.Canceled", lctx.Err())
	}
}
