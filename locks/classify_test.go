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

// class names what an acquisition error is classified as.
func class(err error) string {
	switch busy, unavail := errors.Is(err, locks.ErrBusy), errors.Is(err, locks.ErrUnavailable); {
	case err == nil:
		return "nil"
	case !errors.Is(err, locks.ErrNotObtained):
		return "not ErrNotObtained"
	case busy && unavail:
		return "busy+unavailable"
	case busy:
		return "busy"
	case unavail:
		return "unavailable"
	}
	return "neither"
}

// Every acquisition path sorts its failures the same way, for a Client and a
// Redlock: contention (TryLock, a wait budget spent behind a holder, Redlock
// refusals with a node down) is busy; Redis away (before or during a wait),
// too few replicas (on a direct grant and a hand-off), a closed or closing
// client are unavailable; the caller's context and a lost scope are neither.
func TestFailureClassesEveryPath(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, what string, err error, want string) {
		t.Helper()
		if got := class(err); got != want {
			t.Errorf("%s: %v classified %s, want %s", what, err, got, want)
		}
	}
	t.Run("client", func(t *testing.T) {
		c, rdb, s := newClient(t)
		other := locks.New(s.Client())
		defer other.Close()
		if _, err := other.TryLock(ctx, "cls:held"); err != nil {
			t.Fatal(err)
		}
		_, err := c.Lock(ctx, "cls:held", locks.WaitBudget(200*time.Millisecond))
		check(t, "wait budget spent behind a holder", err, "busy")
		_, err = c.Lock(ctx, "cls:held", locks.Fair(), locks.WaitBudget(200*time.Millisecond))
		check(t, "fair wait budget spent behind a holder", err, "busy")
		_, err = c.TryLock(ctx, "cls:free", locks.Replicas(1, 50*time.Millisecond))
		check(t, "too few replicas", err, "unavailable")
		var re *locks.ReplicaError
		if !errors.As(err, &re) {
			t.Errorf("too few replicas: %v, want a *ReplicaError", err)
		}
		octx := locks.WithOwner(ctx, "req")
		outer, err := c.TryLock(octx, "cls:scope")
		if err != nil {
			t.Fatal(err)
		}
		rdb.Del(ctx, "cg:lock:{cls:scope}")
		_, err = c.TryLock(octx, "cls:scope")
		check(t, "lost scope", err, "neither")
		outer.Unlock(ctx)

		// Redis goes away while a Lock waits.
		got := make(chan error, 1)
		go func() {
			_, err := c.Lock(ctx, "cls:held", locks.WaitBudget(20*time.Second))
			got <- err
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{cls:held}").Val() == 1 })
		s.Kill()
		check(t, "Redis killed during the wait", waitErr(t, got, 15*time.Second, "waiter"), "unavailable")

		closed := locks.New(s.Client())
		closed.Close()
		_, err = closed.TryLock(ctx, "cls:x")
		check(t, "closed client", err, "unavailable")
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("closed client: %v, want ErrClosed", err)
		}
	})
	t.Run("redlock", func(t *testing.T) {
		set := newRedlockSet(t, 3, nil, locks.Lease(time.Second))
		set.holdForeign(t, 0, "cls:rl")
		set.holdForeign(t, 1, "cls:rl")
		_, err := set.r.Lock(ctx, "cls:rl", locks.WaitBudget(300*time.Millisecond))
		check(t, "wait budget spent behind a holder", err, "busy")
		set.servers[2].Kill()
		set.admin[1].Del(ctx, rlKey("cls:rl"))
		_, err = set.r.TryLock(ctx, "cls:rl")
		check(t, "one node refused, one down, one granted", err, "busy")
		_, err = set.r.TryLock(ctx, "cls:rl", locks.Replicas(1, time.Second))
		if !errors.Is(err, locks.ErrInvalid) {
			t.Errorf("Replicas on a Redlock: %v, want ErrInvalid", err)
		}
		set.r.Close()
		_, err = set.r.TryLock(ctx, "cls:rl2")
		check(t, "closed Redlock", err, "unavailable")
		if !errors.Is(err, locks.ErrClosed) {
			t.Errorf("closed Redlock: %v, want ErrClosed", err)
		}
	})
}
