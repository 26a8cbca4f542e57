package locks_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/locks"
)

// wantLost checks that a nested acquisition failed because the owner's scope
// of the name was lost: ErrLost (which matches ErrNotHeld), and neither busy
// nor unavailable (retrying cannot help while the lost Lock is not Unlocked).
func wantLost(t *testing.T, what string, lk *locks.Lock, err error) {
	t.Helper()
	if lk != nil || !errors.Is(err, locks.ErrLost) || !errors.Is(err, locks.ErrNotHeld) ||
		errors.Is(err, locks.ErrBusy) || errors.Is(err, locks.ErrUnavailable) {
		t.Fatalf("%s: %v, %v; want ErrLost (matching ErrNotHeld, not ErrBusy or ErrUnavailable)", what, lk, err)
	}
}

// A lost lock scope is never re-acquired behind the caller's back. Owner O
// holds "repos:1" (fence f1); its lease runs out (here: a fixed lease, so
// nothing renews it); B takes and releases the lock (fence f2). A nested
// acquisition of "repos:1" under O — as gormplugin makes inside a ginmw
// request that locked the resource — must fail and take nothing: otherwise
// it would get a fresh grant (fence f3) and the write based on what O read
// under f1 would land. After O's Unlock, O may lock the name afresh.
func TestLostScopeNotReacquired(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	const name, key = "repos:1", "cg:lock:{repos:1}"
	octx := locks.WithOwner(ctx, "request-O")
	outer, err := c.TryLock(octx, name, locks.Lease(100*time.Millisecond), locks.NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	within(t, outer.Lost(), 2*time.Second, "outer Lost at the end of its fixed lease")
	eventually(t, 2*time.Second, "the key expired", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
	b, err := c.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("B: %v", err)
	}
	if b.Fence() <= outer.Fence() {
		t.Fatalf("B's fence %d not above O's %d", b.Fence(), outer.Fence())
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	lk, err := c.TryLock(octx, name)
	wantLost(t, "nested TryLock", lk, err)
	lk, err = c.Lock(octx, name, locks.WaitBudget(time.Second))
	wantLost(t, "nested Lock", lk, err)
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("a failed nested acquisition left the lock key behind")
	}

	if err := outer.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("outer Unlock: %v, want ErrNotHeld", err)
	}
	again, err := c.TryLock(octx, name)
	if err != nil {
		t.Fatalf("after the outer Unlock, O locks afresh: %v", err)
	}
	if again.Fence() <= b.Fence() {
		t.Fatalf("fresh fence %d not above B's %d", again.Fence(), b.Fence())
	}
	if err := again.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// The same when the process has not noticed the loss yet (a pause, a slow
// renewer): the nested attempt expects a re-entry, finds a fresh grant (the
// outer's key vanished) or another holder, gives back what it took, marks
// the outer lost and fails.
func TestLostScopeDetectedByNestedAttempt(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	const key = "cg:lock:{repos:2}"
	octx := locks.WithOwner(ctx, "request-O")

	t.Run("key vanished", func(t *testing.T) {
		outer, err := c.Lock(octx, "repos:2")
		if err != nil {
			t.Fatal(err)
		}
		rdb.Del(ctx, key) // its lease ran out unnoticed, and B came and went
		lk, err := c.TryLock(octx, "repos:2")
		wantLost(t, "nested TryLock", lk, err)
		if rdb.Exists(ctx, key).Val() != 0 {
			t.Fatal("the fresh grant was not given back")
		}
		within(t, outer.Lost(), time.Second, "outer Lost once the nested attempt saw the loss")
		lk, err = c.Lock(octx, "repos:2")
		wantLost(t, "a second nested Lock", lk, err)
		if err := outer.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
			t.Fatalf("outer Unlock: %v, want ErrNotHeld", err)
		}
		fresh, err := c.TryLock(octx, "repos:2")
		if err != nil {
			t.Fatalf("after the outer Unlock: %v", err)
		}
		fresh.Unlock(ctx)
	})

	t.Run("taken by another", func(t *testing.T) {
		outer, err := c.Lock(octx, "repos:3")
		if err != nil {
			t.Fatal(err)
		}
		rdb.HSet(ctx, "cg:lock:{repos:3}", "o", "owner-B")
		// Lock would wait for B; the scope is lost, so it must fail at once
		// (well before its wait budget) rather than be granted later.
		lk, err := c.Lock(octx, "repos:3", locks.WaitBudget(5*time.Second))
		wantLost(t, "nested Lock", lk, err)
		within(t, outer.Lost(), time.Second, "outer Lost")
		if o := rdb.HGet(ctx, "cg:lock:{repos:3}", "o").Val(); o != "owner-B" {
			t.Fatalf("B's lock was touched: owner %q", o)
		}
		outer.Unlock(ctx)
	})

	t.Run("alive re-enters", func(t *testing.T) {
		outer, err := c.Lock(octx, "repos:4")
		if err != nil {
			t.Fatal(err)
		}
		inner, err := c.Lock(octx, "repos:4")
		if err != nil {
			t.Fatalf("re-entry of a live scope: %v", err)
		}
		if inner.Fence() != outer.Fence() {
			t.Fatalf("re-entry fence %d, outer %d", inner.Fence(), outer.Fence())
		}
		if err := inner.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := outer.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// Redlock: the same guarantee over a quorum of independent servers.
func TestRedlockLostScopeNotReacquired(t *testing.T) {
	ctx := context.Background()
	s := newRedlockSet(t, 3, nil)
	octx := locks.WithOwner(ctx, "request-O")

	t.Run("lease ran out", func(t *testing.T) {
		outer, err := s.r.TryLock(octx, "rl:repos:1", locks.Lease(100*time.Millisecond), locks.NoRenewal())
		if err != nil {
			t.Fatal(err)
		}
		rlWaitClosed(t, outer.Lost(), 2*time.Second, "outer Lost")
		eventually(t, 2*time.Second, "keys expired", func() bool { return rlCountEmpty(s.owners(t, "rl:repos:1", 0, 1, 2)) == 3 })
		b, err := s.r.TryLock(ctx, "rl:repos:1")
		if err != nil {
			t.Fatalf("B: %v", err)
		}
		b.Unlock(ctx)
		lk, err := s.r.TryLock(octx, "rl:repos:1")
		wantLost(t, "nested TryLock", lk, err)
		lk, err = s.r.Lock(octx, "rl:repos:1", locks.WaitBudget(time.Second))
		wantLost(t, "nested Lock", lk, err)
		// A grant that came after the verdict is given back in the background.
		eventually(t, 2*time.Second, "a failed nested acquisition's grants given back", func() bool {
			return rlCountEmpty(s.owners(t, "rl:repos:1", 0, 1, 2)) == 3
		})
		if err := outer.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
			t.Fatalf("outer Unlock: %v, want ErrNotHeld", err)
		}
		fresh, err := s.r.TryLock(octx, "rl:repos:1")
		if err != nil {
			t.Fatalf("after the outer Unlock: %v", err)
		}
		fresh.Unlock(ctx)
	})

	t.Run("keys vanished", func(t *testing.T) {
		outer, err := s.r.Lock(octx, "rl:repos:2")
		if err != nil {
			t.Fatal(err)
		}
		// Lock returns on a quorum's grants; the third may still be on its
		// way, and would land after the deletes below.
		eventually(t, 2*time.Second, "outer on every node", func() bool { return rlCountEmpty(s.owners(t, "rl:repos:2", 0, 1, 2)) == 0 })
		for _, a := range s.admin[:2] { // a quorum forgot it: the outer cannot be held
			a.Del(ctx, rlKey("rl:repos:2"))
		}
		lk, err := s.r.TryLock(octx, "rl:repos:2")
		wantLost(t, "nested TryLock", lk, err)
		// The nodes that granted afresh did not have the holding: they refused
		// the re-entry (the error once said "3 of 3 nodes granted").
		var re *locks.RedlockError
		if !errors.As(err, &re) || len(re.Granted) != 1 || len(re.Refused) != 2 {
			t.Errorf("nested TryLock's error: %v, want 1 node granted (the re-entry) and 2 refused", err)
		}
		rlWaitClosed(t, outer.Lost(), time.Second, "outer Lost")
		if owners := s.owners(t, "rl:repos:2", 0, 1); rlCountEmpty(owners) != 2 {
			t.Fatalf("fresh grants not given back: %v", owners)
		}
		outer.Unlock(ctx)
	})

	t.Run("alive re-enters", func(t *testing.T) {
		outer, err := s.r.Lock(octx, "rl:repos:3")
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 2*time.Second, "outer on every node", func() bool { return rlCountEmpty(s.owners(t, "rl:repos:3", 0, 1, 2)) == 0 })
		s.admin[0].Del(ctx, rlKey("rl:repos:3")) // one node forgot: a quorum still has it
		inner, err := s.r.TryLock(octx, "rl:repos:3")
		if err != nil {
			t.Fatalf("re-entry with the outer on a quorum: %v", err)
		}
		inner.Unlock(ctx)
		if err := outer.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
