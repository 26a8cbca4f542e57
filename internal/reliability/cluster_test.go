package reliability

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// TestReliabilityClusterFailover: on a Redis Cluster with one replica per
// master, holder A takes a lock acknowledged by the replica
// (locks.Replicas), then the master owning its slot is SIGKILLed and the
// replica promoted. The lock survives the failover: B is refused until A
// releases, A's writes still land, and B's fence after the release is above
// A's. Histories are checked with porcupine. Before that, with the replica
// stopped, an acquisition that asks for the acknowledgement is refused
// (*locks.ReplicaError) instead of being granted on the master alone.
func TestReliabilityClusterFailover(t *testing.T) {
	noLeaks(t)
	if testing.Short() {
		t.Skip("a cluster failover takes several seconds; run without -short")
	}
	bg := context.Background()
	cl := redistest.StartCluster(t, redistest.WithReplicas())
	res := redistest.Start(t)
	newClient := func() (*redis.ClusterClient, *locks.Client) {
		cc := cl.Client(func(o *redis.ClusterOptions) {
			// Well above WAIT's timeout below, on a loaded machine.
			o.DialTimeout, o.ReadTimeout, o.WriteTimeout = time.Second, 2*time.Second, time.Second
		})
		c := locks.New(cc)
		t.Cleanup(func() { c.Close() })
		return cc, c
	}
	ccA, a := newClient()
	ccB, b := newClient()
	r := newRecorder(t, Register{RDB: res.Client(), Key: "reg:failover"})
	const lease = 5 * time.Second
	const name = "failover"
	master := cl.MasterForSlot(cl.Slot("cg:lock:{" + name + "}"))
	var replica *redistest.Server
	for i, m := range cl.Masters() {
		if m == master {
			replica = cl.Replicas()[i]
		}
	}
	if replica == nil {
		t.Fatal("no replica for the lock's master")
	}

	// The replica stopped: WAIT gets no acknowledgement, the lock is refused.
	replica.Pause()
	_, err := a.TryLock(bg, name, locks.Lease(lease), locks.NoRenewal(), locks.Replicas(1, 100*time.Millisecond))
	replica.Resume()
	var re *locks.ReplicaError
	r.fig.Attempted++
	if !errors.As(err, &re) {
		t.Fatalf("with the replica stopped: %v, want a *locks.ReplicaError", err)
	}
	r.fig.Refused++

	call := r.lockH.Now()
	holder, err := a.TryLock(bg, name, locks.Lease(lease), locks.NoRenewal(), locks.Replicas(1, 2*time.Second))
	ret := r.lockH.Now()
	if err != nil {
		t.Fatal(err)
	}
	r.fig.Attempted++
	r.fig.Succeeded++
	r.lockH.Add(1, call, ret, LockInput{Op: Acquire, Client: 1, Lease: lease, Call: call, Return: ret}, LockOutput{Outcome: Granted, Fence: holder.Fence()})
	if r.write(holder, 1, "before") != Done {
		t.Fatal("write refused")
	}

	cl.KillMaster(t, master)
	healed := r.lockH.Now()
	// go-redis keeps the old slot map until its periodic reload (#3979).
	ccA.ReloadState(bg)
	ccB.ReloadState(bg)
	for try := 0; ; try++ {
		call := r.lockH.Now()
		lk, err := b.TryLock(bg, name, locks.Lease(lease), locks.NoRenewal())
		ret := r.lockH.Now()
		h, err := classify(lk, err)
		in := LockInput{Op: Acquire, Client: 2, Lease: lease, Call: call, Return: ret}
		r.fig.Attempted++
		if err == errRefused {
			r.fig.Refused++
			r.fig.Recovery = time.Duration(ret - healed)
			r.lockH.Add(2, call, ret, in, LockOutput{Outcome: Refused})
			break
		}
		if err == nil {
			r.fig.Succeeded++
			r.lockH.Add(2, call, ret, in, LockOutput{Outcome: Granted, Fence: h.Fence()})
			t.Errorf("B was granted the lock A holds after the failover")
			h.Unlock(bg)
			break
		}
		r.fig.Unknown++
		in.Return = Never
		r.lockH.Add(2, call, Never, in, LockOutput{Outcome: Unknown})
		if try > 50 {
			t.Fatalf("no answer after the failover: %v", err)
		}
	}
	if r.write(holder, 1, "after-failover") != Done {
		t.Error("A's write after the failover was refused")
	}
	r.unlock(holder, 1)
	next, _ := r.lock(b, 2, name, lease)
	if next.Fence() <= holder.Fence() {
		t.Errorf("fence %d after the failover, not above %d", next.Fence(), holder.Fence())
	}
	if r.write(next, 2, "next") != Done {
		t.Error("B's write was refused")
	}
	r.unlock(next, 2)
	f := r.verify(porcupine.Ok, porcupine.Ok)
	f.Scenario = "cluster master SIGKILLed under a lock acknowledged by its replica (Replicas)"
	f.Report(t)
}
