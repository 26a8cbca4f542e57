package locks_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// A paused shard delays only its own locks' renewals. On a 3-master cluster,
// with a go-redis client as users build it (ContextTimeoutEnabled off, so a
// context deadline does not reach the socket), one master is SIGSTOPped for
// longer than the lease: the locks on the healthy masters keep renewing (their
// keys never expire, Lost stays open), and the locks on the paused master
// report Lost by their local deadline, while the pause still lasts and their
// renewal is still on the wire.
func TestRenewalPausedShard(t *testing.T) {
	ctx := context.Background()
	const lease, pause = 900 * time.Millisecond, 2500 * time.Millisecond
	cl := redistest.StartCluster(t)
	cc := cl.Client() // defaults: ContextTimeoutEnabled false, ReadTimeout 3s
	c := locks.New(cc, locks.Lease(lease))
	t.Cleanup(func() { c.Close() })

	victim := cl.Masters()[0]
	type lock struct {
		name string
		lk   *locks.Lock
		node *redis.Client // the master that owns it, asked directly
	}
	var healthy, paused []lock
	for i := 0; len(healthy) < 4 || len(paused) < 2; i++ {
		name := fmt.Sprintf("pause:%d", i)
		m := cl.MasterForSlot(cl.Slot("cg:lock:{" + name + "}"))
		if m == victim && len(paused) == 2 || m != victim && len(healthy) == 4 {
			continue
		}
		lk, err := c.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		l := lock{name, lk, m.Client()}
		if m == victim {
			paused = append(paused, l)
		} else {
			healthy = append(healthy, l)
		}
	}

	victim.Pause()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			victim.Resume()
		}
	}
	t.Cleanup(resume)
	start := time.Now()
	tick := time.NewTicker(50 * time.Millisecond) // sample the healthy locks through the pause
	defer tick.Stop()
	for ; time.Since(start) < pause; <-tick.C {
		for _, l := range healthy {
			select {
			case <-l.lk.Lost():
				t.Fatalf("%s on a healthy master lost while another master is paused", l.name)
			default:
			}
			if l.node.Exists(ctx, "cg:lock:{"+l.name+"}").Val() != 1 {
				t.Fatalf("%s on a healthy master expired in Redis: its renewal waited for the paused master", l.name)
			}
		}
	}
	for _, l := range paused {
		select {
		case <-l.lk.Lost():
		default:
			t.Fatalf("%s on the paused master: Lost still open %v into the pause, lease %v", l.name, time.Since(start), lease)
		}
	}
	resume()
	for _, l := range paused {
		l.lk.Unlock(ctx) // ErrNotHeld, or the release of a key that outlived the pause
	}
	for _, l := range healthy {
		if err := l.lk.Unlock(ctx); err != nil {
			t.Fatalf("%s: %v", l.name, err)
		}
	}
}
