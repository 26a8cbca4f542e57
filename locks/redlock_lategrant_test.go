package locks

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
)

// TestRedlockLateGrantKept: a node whose acquire reply comes after its node
// time ran out (the call queued past it: see batcher.do) did grant the
// attempt; once the attempt succeeded on the other nodes, that grant is the
// holding's own — a renewal extends it and counts it in the validity — so
// it must stay until the holding is given back. It used to be undone when
// the reply came, which left the holding's validity counting a node that no
// longer kept it (TestGenRedlock: "held 90ms more while 1 of 3 nodes kept
// it"). A late grant of a holding being given back is still undone.
func TestRedlockLateGrantKept(t *testing.T) {
	servers := redistest.StartN(t, 3)
	for _, giveBack := range []bool{false, true} {
		var clients []redis.UniversalClient
		slow := &genFault{}
		for i, s := range servers {
			c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
			if i == 0 {
				c.AddHook(slow)
			}
			clients = append(clients, c)
			t.Cleanup(func() { _ = c.Close() })
		}
		r := NewRedlock(clients, CommandTimeout(2*time.Second), NodeTimeout(100*time.Millisecond))
		t.Cleanup(func() { _ = r.Close() })
		// Node 0's reply comes three node timeouts late: the attempt's
		// quorum is nodes 1 and 2.
		slow.set(&genRule{script: &redlockAcquireS, mode: "delay", d: 300 * time.Millisecond, left: 1})
		name := "late-grant-" + map[bool]string{false: "kept", true: "given-back"}[giveBack]
		lk, err := r.TryLock(context.Background(), name, Lease(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		key, acq := lk.h.keys[0], lk.h.keys[1]
		if giveBack {
			if err := lk.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		redistest.Eventually(t, 5*time.Second, "node 0's late reply delivered", func() bool {
			slow.mu.Lock()
			defer slow.mu.Unlock()
			return len(slow.effects) == 1 && !slow.effects[0].to.IsZero()
		})
		// Whatever the reply set off (a clean-up) has been sent once node 0's
		// batcher is idle.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r.nodes[0].b.drain(ctx)
		cancel()
		kept := servers[0].Client().HExists(context.Background(), key, acq).Val()
		switch {
		case !giveBack && !kept:
			t.Fatalf("node 0's late grant of a holding still held was undone: the holding's renewals count a node that lost it")
		case giveBack && kept:
			t.Fatalf("node 0's late grant of a holding given back was kept: an orphan until its lease ends")
		}
		if !giveBack {
			if err := lk.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			if servers[0].Client().Exists(context.Background(), key).Val() != 0 {
				t.Fatalf("Unlock left node 0's grant")
			}
		}
	}
}
