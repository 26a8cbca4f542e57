package locks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/locks"
)

// Every Locker's failures sort into busy (another owner holds the lock) and
// unavailable (Redis could not be asked), so ginmw and gormplugin can answer
// them alike for a Client and a Redlock.
func TestFailureClasses(t *testing.T) {
	ctx := context.Background()
	t.Run("client", func(t *testing.T) {
		c, _, s := newClient(t)
		lk, err := c.TryLock(ctx, "class:1")
		if err != nil {
			t.Fatal(err)
		}
		defer lk.Unlock(ctx)
		_, err = c.TryLock(ctx, "class:1")
		if !errors.Is(err, locks.ErrBusy) || !errors.Is(err, locks.ErrNotObtained) || errors.Is(err, locks.ErrUnavailable) {
			t.Fatalf("held: %v, want ErrBusy only", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = c.Lock(cctx, "class:1")
		if errors.Is(err, locks.ErrBusy) || errors.Is(err, locks.ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled: %v, want the context's error only", err)
		}
		s.Kill()
		tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
		defer tcancel()
		_, err = c.TryLock(tctx, "class:2")
		if !errors.Is(err, locks.ErrUnavailable) || errors.Is(err, locks.ErrBusy) {
			t.Fatalf("server down: %v, want ErrUnavailable", err)
		}
	})
	t.Run("redlock", func(t *testing.T) {
		set := newRedlockSet(t, 3, nil)
		set.holdForeign(t, 0, "class:3")
		set.holdForeign(t, 1, "class:3")
		_, err := set.r.TryLock(ctx, "class:3")
		if !errors.Is(err, locks.ErrBusy) || errors.Is(err, locks.ErrUnavailable) {
			t.Fatalf("held on a majority: %v, want ErrBusy", err)
		}
		set.servers[0].Kill()
		set.servers[1].Kill()
		_, err = set.r.TryLock(ctx, "class:4")
		if !errors.Is(err, locks.ErrUnavailable) || errors.Is(err, locks.ErrBusy) {
			t.Fatalf("majority down: %v, want ErrUnavailable", err)
		}
	})
}
