package locks

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestGrantRequestNeverResentByGoRedis: a lock request written on a
// connection that then breaks before its reply (the request stuck on the
// wire: in a proxy, a retransmit queue) reaches Redis late — here after the
// call that sent it ended. go-redis used to send the request again at once on
// another connection (MaxRetries): that copy took the lock, its caller used it
// and unlocked, and then the stuck copy took it again, for an acquisition that
// had ended — a hold nobody has, which every other caller waited out for a
// whole lease (found by TestGenLocks with a request run twice; its stuck
// fault is this test's). Now a grant's request is sent once
// (rcmd.Script.Grant): its caller hears that the connection broke, gives back
// what the request may take (with a tombstone), and the stuck copy takes
// nothing when it arrives.
func TestGrantRequestNeverResentByGoRedis(t *testing.T) {
	srv := redistest.Start(t)
	stuck := &genFault{}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	rdb.AddHook(stuck)
	t.Cleanup(func() { _ = rdb.Close() })
	c := New(rdb)
	t.Cleanup(func() { _ = c.Close() })

	ctx := context.Background()
	lk, err := c.TryLock(ctx, "warm") // Redis has the script
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The request stays on the wire 300 ms: the call, and an Unlock after
	// it, are long done when it arrives.
	stuck.set(&genRule{script: &acquireS, mode: "stuck", d: 300 * time.Millisecond, left: 1})
	lk, err = c.TryLock(ctx, "stuck", Lease(time.Minute))
	switch {
	case err == nil:
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	case !errors.Is(err, ErrUnavailable):
		t.Fatalf("TryLock after a broken connection: %v, want a lock or ErrUnavailable", err)
	}
	stuck.wg.Wait() // the stuck request has reached Redis and been answered
	stuck.mu.Lock()
	struck := len(stuck.effects)
	stuck.mu.Unlock()
	if struck != 1 {
		t.Fatalf("%d requests caught on the wire, want 1", struck)
	}
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c.b.drain(dctx) // the give-back of the failed attempt has been answered
	t.Logf("TryLock: %v", err)
	key := keys(c.cfg.prefix, "stuck")[0]
	if ttl := srv.Client().PTTL(ctx, key).Val(); ttl > 0 {
		t.Fatalf("after the stuck request arrived, Redis keeps the lock %v more, for an acquisition that ended", ttl)
	}
	other := New(srv.Client())
	defer other.Close()
	if lk, err := other.TryLock(ctx, "stuck"); err != nil {
		t.Fatalf("another client cannot take the lock: %v", err)
	} else {
		_ = lk.Unlock(ctx)
	}
}
