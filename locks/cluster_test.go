package locks_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

func clusterClient(t *testing.T, cl *redistest.Cluster, opts ...locks.Option) (*locks.Client, *redis.ClusterClient) {
	t.Helper()
	cc := cl.Client()
	c := locks.New(cc, opts...)
	t.Cleanup(func() { c.Close() })
	return c, cc
}

// TestClusterLocks: lock names spread over every master, every script touches
// one slot, and mutual exclusion holds with waiters woken by shard channels.
func TestClusterLocks(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t)
	a, _ := clusterClient(t, cl)
	b, _ := clusterClient(t, cl)

	masters := map[int]bool{}
	for i := range 30 {
		name := fmt.Sprintf("repos:%d", i)
		lk, err := a.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		masters[cl.MasterForSlot(cl.Slot("cg:lock:{"+name+"}")).Port()] = true
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if len(masters) != 3 {
		t.Fatalf("30 lock names landed on %d masters, want 3", len(masters))
	}

	var mu sync.Mutex
	inside, total := 0, 0
	var last uint64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 8 {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Go(func() {
			for range 25 {
				lk, err := c.Lock(ctx, "hot", locks.WaitBudget(30*time.Second))
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				inside++
				if inside != 1 || lk.Fence() <= last {
					errs <- fmt.Errorf("overlap or fence %d <= %d", lk.Fence(), last)
				}
				last = lk.Fence()
				total++
				inside--
				mu.Unlock()
				lk.Unlock(ctx)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if total != 200 {
		t.Fatalf("%d critical sections, want 200", total)
	}
}

// TestClusterSlotMigration: a held lock whose slot moves to another master
// (through the ASK phase and after) stays held, renews, and is released; a
// waiter is woken across the move.
func TestClusterSlotMigration(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t)
	c, cc := clusterClient(t, cl, locks.Lease(600*time.Millisecond))
	w, _ := clusterClient(t, cl)
	lk, err := c.TryLock(ctx, "moving")
	if err != nil {
		t.Fatal(err)
	}
	slot := cl.Slot("cg:lock:{moving}")
	from := cl.MasterForSlot(slot)
	to := cl.OtherMaster(from)
	got := make(chan error, 1)
	go func() {
		wl, err := w.Lock(ctx, "moving", locks.WaitBudget(30*time.Second))
		if err == nil {
			err = wl.Unlock(ctx)
		}
		got <- err
	}()

	mig, err := cl.BeginMigration(ctx, slot, to)
	if err != nil {
		t.Fatal(err)
	}
	var present []string
	for _, k := range []string{"cg:lock:{moving}", "cg:fence:{moving}", "cg:q:{moving}", "cg:qt:{moving}"} {
		if n, _ := cc.Exists(ctx, k).Result(); n == 1 {
			present = append(present, k)
		}
	}
	if err := mig.MoveKeys(ctx, present...); err != nil {
		t.Fatal(err)
	}
	// Mid-migration (ASK): renewing by hand still works.
	if err := lk.Extend(ctx, 600*time.Millisecond); err != nil {
		t.Fatalf("Extend during migration: %v", err)
	}
	if err := mig.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	// Several renewal intervals after the move, the lock is still held.
	select {
	case <-lk.Lost():
		t.Fatal("lock lost when its slot moved")
	case <-time.After(time.Second): // the subject is renewal over time
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after the move: %v", err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("waiter across the move: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("waiter not woken after the slot moved")
	}
}

// TestClusterMasterFailover: killing one master leaves locks on the other
// shards alone; on the failed shard the holder either keeps its lock or sees
// Lost, and a new holder's fence is always above the old one, so a fenced
// resource never accepts both.
func TestClusterMasterFailover(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, redistest.WithReplicas())
	var whyMu sync.Mutex
	why := map[string][]error{}
	c, _ := clusterClient(t, cl, locks.Lease(2*time.Second), locks.Observer(func(_ context.Context, e locks.Event) {
		if e.Kind == locks.EventLost || e.Kind == locks.EventRenewalFailed {
			whyMu.Lock()
			why[e.Name] = append(why[e.Name], e.Err)
			whyMu.Unlock()
		}
	}))
	other, _ := clusterClient(t, cl)

	held := map[string]*locks.Lock{}
	for i := 0; len(held) < 9; i++ {
		name := fmt.Sprintf("fo:%d", i)
		lk, err := c.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		held[name] = lk
	}
	var victimName string
	for name := range held {
		victimName = name
		break
	}
	victim := cl.MasterForSlot(cl.Slot("cg:lock:{" + victimName + "}"))
	cl.KillMaster(t, victim)

	time.Sleep(2500 * time.Millisecond) // let renewals run across the failover (the subject is time)
	for name, lk := range held {
		slotMaster := cl.MasterForSlot(cl.Slot("cg:lock:{" + name + "}"))
		select {
		case <-lk.Lost():
			// Allowed only on the failed shard.
			if sameShardAsVictim(cl, name, victimName) {
				continue
			}
			whyMu.Lock()
			defer whyMu.Unlock()
			t.Fatalf("lock %s on a healthy shard (%v) lost: %v", name, slotMaster.Addr(), why[name])
		default:
		}
	}
	// On the failed shard: whoever holds now has a larger fence than the old holder.
	old := held[victimName]
	nl, err := other.Lock(ctx, victimName, locks.WaitBudget(10*time.Second))
	if err != nil {
		t.Fatalf("the failed shard's lock never became available: %v", err)
	}
	if nl.Fence() <= old.Fence() {
		t.Fatalf("new holder's fence %d not above the old %d", nl.Fence(), old.Fence())
	}
	select {
	case <-old.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("two holders: the old holder did not see Lost after a new grant")
	}
	nl.Unlock(ctx)
	for _, lk := range held {
		lk.Unlock(ctx)
	}
}

func sameShardAsVictim(cl *redistest.Cluster, name, victim string) bool {
	return cl.MasterForSlot(cl.Slot("cg:lock:{"+name+"}")) == cl.MasterForSlot(cl.Slot("cg:lock:{"+victim+"}"))
}

// TestClusterReplicaAcknowledgement: WAIT goes to the master that owns the
// lock's slot (a keyless WAIT elsewhere would succeed vacuously), and 0
// acknowledgements refuse the lock.
func TestClusterReplicaAcknowledgement(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, redistest.WithReplicas())
	c, cc := clusterClient(t, cl)
	owner := cl.MasterForSlot(cl.Slot("cg:lock:{acked}"))
	// Load the scripts first: a NOSCRIPT retry would send the pipeline twice.
	warm, err := c.TryLock(ctx, "acked")
	if err != nil {
		t.Fatal(err)
	}
	warm.Unlock(ctx)
	before := map[int]int{}
	for _, m := range cl.Masters() {
		before[m.Port()] = waitCalls(t, m)
	}
	lk, err := c.TryLock(ctx, "acked", locks.Replicas(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lk.Unlock(ctx)
	for _, m := range cl.Masters() {
		want := before[m.Port()]
		if m == owner {
			want++
		}
		if got := waitCalls(t, m); got != want {
			t.Fatalf("master %s: cmdstat_wait %d, want %d", m.Addr(), got, want)
		}
	}
	// Pause the owning master's replica: 0 acknowledgements.
	var replica *redistest.Server
	for _, r := range cl.Replicas() {
		info, _ := r.Info(ctx, "replication")
		if info["master_port"] == fmt.Sprint(owner.Port()) {
			replica = r
		}
	}
	if replica == nil {
		t.Fatal("no replica found for the owning master")
	}
	replica.Pause()
	defer replica.Resume()
	_, err = c.TryLock(ctx, "acked", locks.Replicas(1, 200*time.Millisecond))
	var re *locks.ReplicaError
	if !errors.As(err, &re) || re.Got != 0 || !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("with the replica paused: %v", err)
	}
	if n, _ := cc.Exists(ctx, "cg:lock:{acked}").Result(); n != 0 {
		t.Fatal("refused lock left behind")
	}
}

// TestSentinelFailover: the same Client works through redis.NewFailoverClient
// and across a Sentinel failover.
func TestSentinelFailover(t *testing.T) {
	ctx := context.Background()
	st := redistest.StartSentinel(t)
	rdb := st.Client()
	c := locks.New(rdb, locks.Lease(time.Second))
	defer c.Close()
	lk, err := c.TryLock(ctx, "sentinel")
	if err != nil {
		t.Fatal(err)
	}
	st.Failover(t)
	// After the failover the lock either survived (replicated) or is free; a
	// new holder must carry a larger fence, and the old holder then sees Lost.
	deadline := time.Now().Add(20 * time.Second)
	var nl *locks.Lock
	for {
		nl, err = c.Lock(ctx, "sentinel-after", locks.WaitBudget(time.Second))
		if err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("locking through the failover client after failover: %v", err)
	}
	nl.Unlock(ctx)
	lk.Unlock(ctx)
}

// Every lock name works on a cluster: names with braces — one starting with
// '}' used to leave the hash tag empty, so a lock's keys fell in different
// slots and every call failed with CROSSSLOT — keep all of a lock's keys (and
// its wake-up channel) in one slot, through TryLock, a hand-off to a waiter,
// re-entry and Unlock, on a Client and a Redlock over cluster nodes.
func TestClusterOddNames(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t)
	a, _ := clusterClient(t, cl, locks.Lease(2*time.Second))
	b, _ := clusterClient(t, cl)
	rl := locks.NewRedlock([]redis.UniversalClient{cl.Client()})
	defer rl.Close()
	for _, name := range []string{"}x", "}", "a}b", "{", "{}", "}{", "{a}", "x{y}z", "}}{{"} {
		lk, err := a.TryLock(ctx, name)
		if err != nil {
			t.Fatalf("%q: TryLock: %v", name, err)
		}
		got := make(chan error, 1)
		go func() {
			wl, err := b.Lock(ctx, name, locks.WaitBudget(10*time.Second))
			if err == nil {
				err = wl.Unlock(ctx)
			}
			got <- err
		}()
		eventually(t, 5*time.Second, fmt.Sprintf("%q: the waiter's queue place", name), func() bool {
			return b.Held() == 0 && queued(ctx, cl, name)
		})
		if err := lk.Unlock(ctx); err != nil {
			t.Fatalf("%q: Unlock: %v", name, err)
		}
		if err := waitErr(t, got, 10*time.Second, fmt.Sprintf("%q: waiter", name)); err != nil {
			t.Fatalf("%q: waiter: %v", name, err)
		}
		octx := locks.WithOwner(ctx, "req")
		outer, err := a.TryLock(octx, name)
		if err != nil {
			t.Fatalf("%q: owner: %v", name, err)
		}
		inner, err := a.TryLock(octx, name)
		if err != nil || inner.Fence() != outer.Fence() {
			t.Fatalf("%q: re-entry: %v", name, err)
		}
		inner.Unlock(ctx)
		outer.Unlock(ctx)
		rlk, err := rl.TryLock(ctx, name)
		if err != nil {
			t.Fatalf("%q: Redlock: %v", name, err)
		}
		rlk.Unlock(ctx)
	}
}

// queued reports whether some waiter has a place in name's queue on the
// cluster (the queue key is found by scanning every master).
func queued(ctx context.Context, cl *redistest.Cluster, name string) bool {
	for _, m := range cl.Masters() {
		keys, _ := m.Do(ctx, "KEYS", "cg:q:*")
		list, _ := keys.([]any)
		for _, k := range list {
			ks, _ := k.(string)
			if strings.HasSuffix(ks, "}"+name) || strings.HasSuffix(ks, "{"+name+"}") {
				if n, _ := m.Do(ctx, "ZCARD", ks); n != int64(0) {
					return true
				}
			}
		}
	}
	return false
}
