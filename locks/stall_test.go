package locks

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// stallClient is a client of s whose commands wait for Redis as long as
// their context allows (no read or write timeout of its own): with Redis
// paused, a call ends only when its context does.
func stallClient(s *redistest.Server) *redis.Client {
	return s.Client(func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.ReadTimeout, o.WriteTimeout = -1, -1
		o.MaxRetries = -1
	})
}

// returnsWithin waits up to d for done and fails the test if it does not
// come: d is far beyond the bound the call must keep, so only a call that
// waits for the stall to end misses it.
func returnsWithin[T any](t *testing.T, done <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		t.Fatalf("%s: still waiting %v later, with Redis paused", what, d)
	}
	var zero T
	return zero
}

// TestClaimedWaiterEndsWithItsContext: with Redis paused, an Unlock whose
// release claimed the next local waiter at the gate hangs on Redis; that
// waiter's Lock must still end when its own context does, not when the
// release returns. Once Redis answers, what the release did for the waiter
// (queued it, or handed it the lock) is given back: the lock is free again.
func TestClaimedWaiterEndsWithItsContext(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	p, x := New(stallClient(s)), New(s.Client())
	defer p.Close()
	defer x.Close()
	rdb := s.Client()
	held, err := x.TryLock(ctx, "claimed")
	if err != nil {
		t.Fatal(err)
	}
	a := make(chan *Lock, 1)
	go func() {
		lk, err := p.Lock(ctx, "claimed", WithWait(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		a <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "A queued", func() bool { return rdb.ZCard(ctx, "cg:q:{claimed}").Val() == 1 })
	bctx, cancelB := context.WithCancel(ctx)
	defer cancelB()
	b := make(chan error, 1)
	go func() {
		lk, err := p.Lock(bctx, "claimed", WithWait(10*time.Second))
		if err == nil {
			_ = lk.Unlock(ctx)
		}
		b <- err
	}()
	redistest.Eventually(t, 5*time.Second, "B at the gate", func() bool { return gateLen(p, "cg:lock:{claimed}") == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lkA := <-a
	if lkA == nil {
		t.FailNow()
	}

	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	claimed := make(chan struct{})
	testHookClaimed = func() { close(claimed) }
	defer func() { testHookClaimed = nil }()
	unlocked := make(chan error, 1)
	uctx, cancelU := context.WithTimeout(ctx, time.Minute) // longer than the test: the release hangs on Redis
	defer cancelU()
	go func() { unlocked <- lkA.Unlock(uctx) }()
	returnsWithin(t, claimed, 10*time.Second, "A's release claiming B")
	start := time.Now()
	cancelB()
	err = returnsWithin(t, b, 5*time.Second, "B's Lock after its context ended")
	t.Logf("B returned %v after its context ended, Redis paused: %v", time.Since(start), err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v, want context.Canceled", err)
	}

	s.Resume()
	resumed = true
	if err := returnsWithin(t, unlocked, 10*time.Second, "A's Unlock after Redis resumed"); err != nil {
		t.Logf("A's Unlock: %v", err)
	}
	redistest.Eventually(t, 10*time.Second, "the lock free again", func() bool {
		return rdb.Exists(ctx, "cg:lock:{claimed}", "cg:q:{claimed}").Val() == 0
	})
	lk, err := x.TryLock(ctx, "claimed")
	if err != nil {
		t.Fatalf("after B gave up: %v", err)
	}
	_ = lk.Unlock(ctx)
}
