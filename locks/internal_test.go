package locks

import (
	"context"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestAcquireIdempotentUnderRetry: go-redis re-sends a command whose reply was
// lost; the script sees its own acquisition id and answers success again
// without taking a second hold.
func TestAcquireIdempotentUnderRetry(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	c := New(rdb)
	defer c.Close()
	ks := keys("cg:", "retry")
	cfg := c.cfg
	first, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, "")
	if err != nil || !first.ok {
		t.Fatalf("first attempt: %+v %v", first, err)
	}
	again, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, "")
	if err != nil || !again.ok || again.fence != first.fence || again.holds != 1 {
		t.Fatalf("retried attempt: %+v %v, want success with fence %d and 1 hold", again, err, first.fence)
	}
	if n := rdb.HGet(ctx, ks[0], "n").Val(); n != "1" {
		t.Fatalf("hold count %s after a retried acquire, want 1", n)
	}
}

// TestReleaseIdempotentUnderRetry: go-redis re-sends a release whose reply was
// lost; the second run finds that hold already given back and changes
// nothing, so a re-entered lock keeps its other hold.
func TestReleaseIdempotentUnderRetry(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	c := New(rdb)
	defer c.Close()
	ks := keys("cg:", "rel")
	kv := boxKeys(ks)
	cfg := c.cfg
	for _, acq := range []string{"outer", "inner"} {
		if res, err := c.attempt(ctx, ks, kv, "owner-1", acq, cfg, ""); err != nil || !res.ok {
			t.Fatalf("acquire %s: %+v %v", acq, res, err)
		}
	}
	if n := rdb.HGet(ctx, ks[0], "n").Val(); n != "2" {
		t.Fatalf("hold count %s, want 2", n)
	}
	for range 2 { // the release and its retry
		n, err := c.releaseRaw(ctx, kv, "owner-1", "inner", cfg, "")
		if err != nil || n != 1 {
			t.Fatalf("release of the inner hold: %d %v, want 1 hold left", n, err)
		}
	}
	if n := rdb.HGet(ctx, ks[0], "n").Val(); n != "1" {
		t.Fatalf("hold count %s after a retried release, want 1", n)
	}
	if n, err := c.releaseRaw(ctx, kv, "owner-1", "outer", cfg, ""); err != nil || n != 0 {
		t.Fatalf("last release: %d %v", n, err)
	}
	if rdb.Exists(ctx, ks[0]).Val() != 0 {
		t.Fatal("lock left after the last hold")
	}
}

// releaseRaw releases hold acq of owner (and queue place mine), reporting the
// remaining holds.
func (c *Client) releaseRaw(ctx context.Context, kv []any, owner, acq any, cfg config, mine any) (int64, error) {
	return releaseS.runVia(ctx, c.b, nil, kv, owner, acq, mine, cfg.argsReleaseV, c.pubV).Int64()
}

// TestReleaseSeesQueuedWaiters: a release skips the queue unless the lock
// hash carries w (release.lua's fast path), so every way a waiter can be
// queued behind an existing lock must set it; otherwise the release would
// drop the lock without handing it on and the waiter would sleep until its
// timer. Each case ends with a release that must hand the lock to the waiter.
func TestReleaseSeesQueuedWaiters(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	c := New(rdb)
	defer c.Close()
	cfg := c.cfg
	member := func(owner string) string {
		return owner + "|" + cfg.leaseV.(string) + "|" + c.id + "|" + owner // as acquire.lua builds it
	}
	handedTo := func(t *testing.T, ks []string, kv []any, holder, waiter string) {
		t.Helper()
		if w := rdb.HGet(ctx, ks[0], "w").Val(); w != "1" {
			t.Fatalf("w = %q with a waiter queued, want 1", w)
		}
		if n, err := c.releaseRaw(ctx, kv, holder, holder, cfg, ""); err != nil || n != 0 {
			t.Fatalf("release: %d %v", n, err)
		}
		if o := rdb.HGet(ctx, ks[0], "o").Val(); o != waiter {
			t.Fatalf("after the release the lock is held by %q, want it handed to %q", o, waiter)
		}
	}

	t.Run("queued behind a holder", func(t *testing.T) {
		ks := keys("cg:", "wq1")
		kv := boxKeys(ks)
		if res, err := c.attempt(ctx, ks, kv, "A", "A", cfg, ""); err != nil || !res.ok {
			t.Fatalf("A: %+v %v", res, err)
		}
		if res, err := c.attempt(ctx, ks, kv, "B", "B", cfg, member("B")); err != nil || res.ok {
			t.Fatalf("B should queue: %+v %v", res, err)
		}
		handedTo(t, ks, kv, "A", "B")
		// The hand-off keeps w (more may be queued): B's release checks the
		// queue, finds it empty, and drops the lock.
		if n, err := c.releaseRaw(ctx, kv, "B", "B", cfg, ""); err != nil || n != 0 {
			t.Fatalf("B's release: %d %v", n, err)
		}
		if rdb.Exists(ctx, ks[0]).Val() != 0 {
			t.Fatal("lock left after the last release")
		}
	})

	t.Run("queue left behind a lock that expired", func(t *testing.T) {
		// A waiter is queued; the holder's lock vanishes without a release
		// (its lease ran out); a new holder takes the free lock while the
		// queue still holds the waiter: the new lock must carry w.
		ks := keys("cg:", "wq2")
		kv := boxKeys(ks)
		if res, err := c.attempt(ctx, ks, kv, "A", "A", cfg, ""); err != nil || !res.ok {
			t.Fatalf("A: %+v %v", res, err)
		}
		if res, err := c.attempt(ctx, ks, kv, "B", "B", cfg, member("B")); err != nil || res.ok {
			t.Fatalf("B should queue: %+v %v", res, err)
		}
		rdb.Del(ctx, ks[0]) // A's lease ran out
		if res, err := c.attempt(ctx, ks, kv, "C", "C", cfg, ""); err != nil || !res.ok {
			t.Fatalf("C takes the free lock: %+v %v", res, err)
		}
		handedTo(t, ks, kv, "C", "B")
	})
}

// TestHandOffWakesOnlyItsProcess: a hand-off is published on the channel of
// the waiter's client alone, so the other processes waiting for the lock are
// not woken (nor Redis made to write to them) for it.
func TestHandOffWakesOnlyItsProcess(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	a, b, w := New(rdb), New(rdb), New(rdb)
	defer a.Close()
	defer b.Close()
	defer w.Close()
	watch := rdb.PSubscribe(ctx, "cg:lock:{solo}:w*")
	defer watch.Close()
	if _, err := watch.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := a.TryLock(ctx, "solo")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 2)
	for _, c := range []*Client{b, w} {
		go func() {
			lk, err := c.Lock(ctx, "solo", WithWait(10*time.Second))
			if err == nil {
				err = lk.Unlock(ctx)
			}
			got <- err
		}()
	}
	redistest.Eventually(t, 5*time.Second, "both waiters queued and subscribed", func() bool {
		return rdb.ZCard(ctx, "cg:q:{solo}").Val() == 2 && len(rdb.PubSubChannels(ctx, "cg:lock:{solo}:w*").Val()) == 2 // the watcher is a pattern
	})
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-got; err != nil {
			t.Fatal(err)
		}
	}
	// Two hand-offs: to the first waiter, then from it to the second; each on
	// its waiter's own channel.
	seen := map[string]bool{}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for range 2 {
		m, err := watch.ReceiveMessage(rctx)
		if err != nil {
			t.Fatal(err)
		}
		seen[m.Channel] = true
	}
	want := map[string]bool{b.channel("cg:lock:{solo}"): true, w.channel("cg:lock:{solo}"): true}
	if len(seen) != 2 || !seen[b.channel("cg:lock:{solo}")] || !seen[w.channel("cg:lock:{solo}")] {
		t.Fatalf("hand-offs published on %v, want one on each waiter's channel %v", seen, want)
	}
}
