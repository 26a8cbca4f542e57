package locks_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// What a lock name leaves behind is bounded: its fence counter lives for the
// fence retention after the name was last taken (10 minutes by default, not 7
// days), so the counters in Redis are bounded by the names taken in that
// window, and each costs a few dozen bytes. The test also measures the cost.
func TestFenceCounterBounded(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()

	t.Run("default retention", func(t *testing.T) {
		c := locks.New(s.Client())
		defer c.Close()
		lk, err := c.TryLock(ctx, "bound:default")
		if err != nil {
			t.Fatal(err)
		}
		lk.Unlock(ctx)
		pttl := rdb.PTTL(ctx, "cg:fence:{bound:default}").Val()
		if pttl <= 0 || pttl > 10*time.Minute {
			t.Fatalf("counter PTTL %v, want within the default retention of 10 minutes", pttl)
		}
		used, err := rdb.MemoryUsage(ctx, "cg:fence:{bound:default}").Result()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("one fence counter: %d bytes (MEMORY USAGE)", used)
	})

	t.Run("expire after retention", func(t *testing.T) {
		const retention = 300 * time.Millisecond
		c := locks.New(s.Client(), locks.Lease(100*time.Millisecond), locks.FenceRetention(retention))
		defer c.Close()
		before := rdb.DBSize(ctx).Val()
		for i := range 50 {
			lk, err := c.TryLock(ctx, fmt.Sprintf("bound:%d", i))
			if err != nil {
				t.Fatal(err)
			}
			lk.Unlock(ctx)
		}
		if n := rdb.DBSize(ctx).Val() - before; n != 50 {
			t.Fatalf("%d keys after 50 names were taken and released, want their 50 counters", n)
		}
		eventually(t, 5*time.Second, "counters expired", func() bool { return rdb.DBSize(ctx).Val() == before })
	})
}

// Fence tokens stay strictly increasing when the counter is behind what was
// issued: a failover to a replica that missed the last INCRs (asynchronous
// replication), or a counter that expired or was evicted. A token is never
// below the server's clock in microseconds, nor below the counter plus one.
func TestFenceMonotonicWithStaleCounter(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	var last uint64
	take := func(what string) {
		t.Helper()
		lk, err := c.TryLock(ctx, "stale")
		if err != nil {
			t.Fatal(err)
		}
		if lk.Fence() <= last {
			t.Fatalf("%s: fence %d not above the previous %d", what, lk.Fence(), last)
		}
		last = lk.Fence()
		lk.Unlock(ctx)
	}
	take("first")
	take("second")
	// A failover to a replica that had not received the last increments.
	rdb.Set(ctx, "cg:fence:{stale}", strconv.FormatUint(last-1, 10), 0)
	take("after the counter went back by one")
	rdb.Set(ctx, "cg:fence:{stale}", "1", 0)
	take("after the counter went back to 1")
	rdb.Del(ctx, "cg:fence:{stale}")
	take("after the counter was lost")
	// A hand-off issues its token the same way.
	holder, err := c.TryLock(ctx, "stale")
	if err != nil {
		t.Fatal(err)
	}
	if holder.Fence() <= last {
		t.Fatalf("fence %d not above %d", holder.Fence(), last)
	}
	last = holder.Fence()
	rdb.Set(ctx, "cg:fence:{stale}", "7", 0)
	got := make(chan *locks.Lock, 1)
	go func() {
		lk, err := c.Lock(ctx, "stale", locks.Fair(), locks.WaitBudget(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{stale}").Val() == 1 })
	holder.Unlock(ctx)
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	if lk.Fence() <= last {
		t.Fatalf("hand-off after the counter went back: fence %d not above %d", lk.Fence(), last)
	}
	lk.Unlock(ctx)
}

// A counter ahead of the clock (the server's clock stepped back, or more than
// one token per microsecond) decides the token: counter plus one, every time.
// (Tokens are exact up to 2^53, about the year 2255.)
func TestFenceCounterAheadOfClock(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	for _, ahead := range []uint64{
		uint64(time.Now().Add(time.Hour).UnixMicro()),
		9000000000000000,
	} {
		rdb.Set(ctx, "cg:fence:{ahead}", strconv.FormatUint(ahead, 10), 0)
		for i := uint64(1); i <= 2; i++ {
			lk, err := c.TryLock(ctx, "ahead")
			if err != nil {
				t.Fatal(err)
			}
			if lk.Fence() != ahead+i {
				t.Fatalf("counter %d: fence %d, want %d", ahead, lk.Fence(), ahead+i)
			}
			lk.Unlock(ctx)
		}
	}
}

// NoFencing keeps no fence counter: its Locks report Fence 0 (and so do their
// events), and a name taken and handed on under it leaves no key behind. The
// holdings are still told apart: a waiter is handed the lock, and a
// re-entry under the same owner shares the holding.
func TestNoFencingKeepsNoCounter(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	var fences []uint64
	var mu sync.Mutex
	obs := locks.Observer(func(_ context.Context, e locks.Event) {
		mu.Lock()
		fences = append(fences, e.Fence)
		mu.Unlock()
	})
	c := locks.New(rdb, locks.NoFencing(), obs)
	defer c.Close()

	octx := locks.WithOwner(ctx, locks.NewOwnerID())
	a, err := c.TryLock(octx, "nofence")
	if err != nil {
		t.Fatal(err)
	}
	if f := a.Fence(); f != 0 {
		t.Fatalf("Fence %d under NoFencing, want 0", f)
	}
	again, err := c.TryLock(octx, "nofence") // re-entry
	if err != nil {
		t.Fatal(err)
	}
	waiter := make(chan error, 1)
	go func() {
		b, err := c.Lock(ctx, "nofence", locks.WaitBudget(10*time.Second))
		if err == nil {
			if b.Fence() != 0 {
				err = fmt.Errorf("handed-off Fence %d, want 0", b.Fence())
			}
			if uerr := b.Unlock(ctx); err == nil {
				err = uerr
			}
		}
		waiter <- err
	}()
	eventually(t, 5*time.Second, "the waiter to queue", func() bool { return rdb.Exists(ctx, "cg:q:{nofence}").Val() == 1 })
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); err != nil { // hands the lock to the waiter
		t.Fatal(err)
	}
	if err := <-waiter; err != nil {
		t.Fatal(err)
	}
	if keys := rdb.Keys(ctx, "cg:*").Val(); len(keys) > 0 {
		t.Fatalf("keys left behind under NoFencing: %v", keys)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, f := range fences {
		if f != 0 {
			t.Fatalf("event fences %v, want all 0", fences)
		}
	}
}
