package locks

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestOneSubscriptionForManyWaiters (issue 33, item 5): a process's waiters
// for one lock share one listener on the client's hand-off channel, in
// default and in fair mode, so that a hand-off is routed to the waiter it
// names instead of being copied to every waiter's subscription; and every
// waiter still gets the lock in turn.
func TestOneSubscriptionForManyWaiters(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	c := New(rdb)
	defer c.Close()
	const n = 40
	for _, fair := range []bool{false, true} {
		t.Run(map[bool]string{false: "default", true: "fair"}[fair], func(t *testing.T) {
			name := fmt.Sprintf("fanout-%v", fair)
			var opts []CallOption
			if fair {
				opts = append(opts, Fair())
			}
			holder, err := c.TryLock(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			ks := keys("cg:", name)
			var wg sync.WaitGroup
			errs := make(chan error, n)
			for range n {
				wg.Go(func() {
					lk, err := c.Lock(ctx, name, opts...)
					if err != nil {
						errs <- err
						return
					}
					errs <- lk.Unlock(ctx)
				})
			}
			// Every waiter is in place: queued at the gate (default mode,
			// one of them waiting in Redis) or in Redis (fair mode).
			redistest.Eventually(t, 10*time.Second, "all waiting", func() bool {
				if fair {
					return rdb.ZCard(ctx, ks[2]).Val() == n
				}
				return gateLen(c, ks[0]) == n-1 && rdb.ZCard(ctx, ks[2]).Val() == 1
			})
			if got := c.hub.Listeners(c.channel(ks[0])); got != 1 {
				t.Errorf("%d listeners on the hand-off channel for %d waiters, want 1", got, n)
			}
			if err := holder.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
