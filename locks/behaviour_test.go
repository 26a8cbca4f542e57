package locks_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/logtest"
	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// within waits for ch to close, failing the test after d.
func within(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s: not within %v", what, d)
	}
}

// eventually waits for an observable event, bounded by d.
var eventually = redistest.Eventually

func TestRenewalKeepsLockAlive(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t, locks.Lease(150*time.Millisecond))
	lk, err := c.TryLock(ctx, "renewed")
	if err != nil {
		t.Fatal(err)
	}
	// Hold for several leases; the watchdog must keep extending.
	deadline := time.Now().Add(600 * time.Millisecond)
	for time.Now().Before(deadline) {
		select {
		case <-lk.Lost():
			t.Fatal("lock lost while held and renewed")
		case <-time.After(50 * time.Millisecond):
		}
		if n, _ := rdb.Exists(ctx, "cg:lock:{renewed}").Result(); n != 1 {
			t.Fatal("lock key expired while held")
		}
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Held() != 0 {
		t.Fatalf("Held() = %d after Unlock", c.Held())
	}
}

func TestFixedLeaseExpires(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	lk, err := c.TryLock(ctx, "fixed", locks.Lease(100*time.Millisecond), locks.NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	within(t, lk.Lost(), 2*time.Second, "Lost after a fixed lease")
	within(t, lk.Context().Done(), time.Second, "Context cancelled")
	eventually(t, 2*time.Second, "key expired", func() bool { return rdb.Exists(ctx, "cg:lock:{fixed}").Val() == 0 })
	if err := lk.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("Unlock after expiry = %v, want ErrNotHeld", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock = %v, want nil", err)
	}
}

func TestExtendByHand(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	lk, err := c.TryLock(ctx, "ext", locks.Lease(time.Second), locks.NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if pttl := rdb.PTTL(ctx, "cg:lock:{ext}").Val(); pttl < 4*time.Second {
		t.Fatalf("PTTL after Extend = %v", pttl)
	}
	if lk.TTL() < 4*time.Second {
		t.Fatalf("TTL() after Extend = %v", lk.TTL())
	}
	if err := lk.Extend(ctx, time.Millisecond); !errors.Is(err, locks.ErrInvalid) {
		t.Fatalf("Extend(1ms) = %v, want ErrInvalid", err)
	}
	rdb.Del(ctx, "cg:lock:{ext}")
	if err := lk.Extend(ctx, time.Second); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("Extend of a deleted lock = %v, want ErrNotHeld", err)
	}
	within(t, lk.Lost(), time.Second, "Lost after failed Extend")
}

// An Extend whose context has already ended is refused with the context's
// error before any call to Redis, as one past its deadline already was: it
// used to extend the lease under a cancelled context and return nil.
func TestExtendUnderEndedContextExtendsNothing(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	lk, err := c.TryLock(ctx, "ext-ended", locks.Lease(time.Second), locks.NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	past, cancelPast := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancelPast()
	for _, tc := range []struct {
		ctx  context.Context
		want error
	}{{cancelled, context.Canceled}, {past, context.DeadlineExceeded}} {
		if err := lk.Extend(tc.ctx, time.Minute); !errors.Is(err, tc.want) {
			t.Errorf("Extend under an ended context = %v, want %v", err, tc.want)
		}
		if pttl := rdb.PTTL(ctx, "cg:lock:{ext-ended}").Val(); pttl > 2*time.Second {
			t.Errorf("PTTL after a refused Extend = %v, want the 1s lease", pttl)
		}
	}
}

// TestLostWhenDeleted: deleting the key out of band closes Lost() within one
// renewal interval (a third of the lease).
func TestLostWhenDeleted(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t, locks.Lease(300*time.Millisecond))
	lk, err := c.TryLock(ctx, "deleted")
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, "cg:lock:{deleted}")
	within(t, lk.Lost(), 100*time.Millisecond+200*time.Millisecond, "Lost after DEL")
	within(t, lk.Context().Done(), time.Second, "Context cancelled after loss")
	if err := lk.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("Unlock = %v, want ErrNotHeld", err)
	}
}

// TestLostWhenTakenOver: another owner holding the key is a loss too.
func TestLostWhenTakenOver(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t, locks.Lease(300*time.Millisecond))
	lk, err := c.TryLock(ctx, "taken")
	if err != nil {
		t.Fatal(err)
	}
	rdb.HSet(ctx, "cg:lock:{taken}", "o", "someone-else")
	within(t, lk.Lost(), time.Second, "Lost after takeover")
	if err := lk.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("Unlock = %v, want ErrNotHeld", err)
	}
	if o := rdb.HGet(ctx, "cg:lock:{taken}", "o").Val(); o != "someone-else" {
		t.Fatalf("the other owner's lock was touched: o=%q", o)
	}
}

// TestSeedLateDelete is the seeds' timeline: A's lease runs out mid-work, B
// acquires, then A finishes and "deletes the lock". A's release is refused and
// B's lock is intact.
func TestSeedLateDelete(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	a, err := c.TryLock(ctx, "timeline", locks.Lease(50*time.Millisecond), locks.NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "A's lease ran out", func() bool { return rdb.Exists(ctx, "cg:lock:{timeline}").Val() == 0 })
	b, err := c.TryLock(ctx, "timeline")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("A's late Unlock = %v, want ErrNotHeld", err)
	}
	if err := b.Extend(ctx, time.Second); err != nil {
		t.Fatalf("B's lock was damaged by A: %v", err)
	}
	if b.Fence() <= a.Fence() {
		t.Fatalf("B's fence %d not above A's %d", b.Fence(), a.Fence())
	}
	b.Unlock(ctx)
}

// TestSeedNoLeaseGap is the seeds' SETNX-then-EXPIRE crash: a lock key without
// a lease can never exist, because the key and its lease are written by one
// script. Every key observed right after acquisition (in the same MULTI as a
// PTTL) already has its lease.
func TestSeedNoLeaseGap(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	for i := range 50 {
		name := "gap:" + strconv.Itoa(i)
		lk, err := c.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if pttl := rdb.PTTL(ctx, "cg:lock:{"+name+"}").Val(); pttl <= 0 {
			t.Fatalf("lock key without a lease: PTTL %v", pttl)
		}
		lk.Unlock(ctx)
	}
	// The control: the broken two-step lock leaves a lease-less key if the
	// client dies between the steps.
	rdb.SetNX(ctx, "broken:lock", "me", 0) // ... and the process dies before EXPIRE
	if pttl := rdb.PTTL(ctx, "broken:lock").Val(); pttl != -1 {
		t.Fatalf("control: PTTL = %v, want -1 (no lease: a deadlock)", pttl)
	}
}

func TestFenceSurvivesCounterLoss(t *testing.T) {
	ctx := context.Background()
	c, rdb, s := newClient(t)
	lk, err := c.TryLock(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	first := lk.Fence()
	lk.Unlock(ctx)
	rdb.Del(ctx, "cg:fence:{fenced}")
	lk, err = c.TryLock(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	second := lk.Fence()
	lk.Unlock(ctx)
	if second <= first {
		t.Fatalf("after the counter was deleted: fence %d not above %d", second, first)
	}
	// A restart without persistence loses every key.
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "server back", func() bool { return rdb.Ping(ctx).Err() == nil })
	lk, err = c.TryLock(ctx, "fenced")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	if lk.Fence() <= second {
		t.Fatalf("after a restart: fence %d not above %d", lk.Fence(), second)
	}
}

func TestReentrancyByOwner(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	octx := locks.WithOwner(ctx, "request-1")
	outer, err := c.Lock(octx, "re")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.Lock(octx, "re", locks.WaitBudget(time.Second))
	if err != nil {
		t.Fatalf("re-entry: %v", err)
	}
	if n := rdb.HGet(ctx, "cg:lock:{re}", "n").Val(); n != "2" {
		t.Fatalf("hold count %q, want 2", n)
	}
	if inner.Fence() != outer.Fence() {
		t.Fatalf("re-entry fence %d differs from %d", inner.Fence(), outer.Fence())
	}
	// Another owner is refused, and its Unlock changes nothing.
	if _, err := c.TryLock(locks.WithOwner(ctx, "request-2"), "re"); !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("other owner: %v", err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := inner.Unlock(ctx); err != nil { // twice: must not decrement again
		t.Fatal(err)
	}
	if n := rdb.HGet(ctx, "cg:lock:{re}", "n").Val(); n != "1" {
		t.Fatalf("hold count %q after one Unlock (called twice), want 1", n)
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, "cg:lock:{re}").Val() != 0 {
		t.Fatal("lock key left after the last Unlock")
	}
}

// TestUnlockByNonOwnerRefused: a forged release (wrong owner) is refused by
// the script and leaves the lock as it was.
func TestUnlockByNonOwnerRefused(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	lk, err := c.TryLock(ctx, "mine")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	before := rdb.HGetAll(ctx, "cg:lock:{mine}").Val()
	// A second client that believes it holds "mine" under another owner.
	other := locks.New(rdb)
	defer other.Close()
	octx := locks.WithOwner(ctx, "intruder")
	if _, err := other.TryLock(octx, "mine"); !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("intruder TryLock: %v", err)
	}
	after := rdb.HGetAll(ctx, "cg:lock:{mine}").Val()
	if before["o"] != after["o"] || before["n"] != after["n"] {
		t.Fatalf("lock changed by a non-owner: %v -> %v", before, after)
	}
}

func TestWaiterCancelled(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t)
	lk, err := c.TryLock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	before := runtime.NumGoroutine()
	wctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Lock(wctx, "busy")
		errc <- err
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{busy}").Val() == 1 })
	cancel()
	var got error
	select {
	case got = <-errc:
	case <-time.After(2 * time.Second):
		t.Fatal("cancelled waiter did not return")
	}
	if !errors.Is(got, context.Canceled) || !errors.Is(got, locks.ErrNotObtained) {
		t.Fatalf("cancelled waiter: %v, want ErrNotObtained and context.Canceled", got)
	}
	// Its place is given back without waiting (it must not outlive its
	// context to clean up after itself).
	eventually(t, 5*time.Second, "the cancelled waiter's place given back", func() bool {
		return rdb.ZCard(ctx, "cg:q:{busy}").Val() == 0
	})
	eventually(t, 10*time.Second, "subscription gone", func() bool {
		return len(rdb.PubSubChannels(ctx, "cg:lock:{busy}:w*").Val()) == 0
	})
	// What remains is the client's shared subscription reader, stopped by Close.
	c.Close()
	eventually(t, 5*time.Second, "goroutines back", func() bool { return runtime.NumGoroutine() <= before })
}

func TestWaitBudget(t *testing.T) {
	ctx := context.Background()
	c, _, _ := newClient(t)
	lk, err := c.TryLock(ctx, "budget")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	_, err = c.Lock(ctx, "budget", locks.WaitBudget(100*time.Millisecond))
	var noe *locks.NotObtainedError
	if !errors.As(err, &noe) || noe.RetryAfter <= 0 {
		t.Fatalf("Lock past its budget = %v", err)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("the budget is not the caller's context: %v", err)
	}
	// The caller's deadline, when it ends first, is reported as such.
	dctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := c.Lock(dctx, "budget"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock past the caller's deadline = %v", err)
	}
}

// TestFairOrder: in fair mode the lock goes to waiters in arrival order.
func TestFairOrder(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t, locks.Fair())
	holder, err := c.Lock(ctx, "fifo")
	if err != nil {
		t.Fatal(err)
	}
	const n = 6
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			lk, err := c.Lock(ctx, "fifo", locks.WaitBudget(20*time.Second))
			if err != nil {
				order <- -1
				return
			}
			order <- i
			lk.Unlock(ctx)
		})
		// The next waiter arrives only once this one is queued.
		eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{fifo}").Val() == int64(i+1) })
	}
	holder.Unlock(ctx)
	wg.Wait()
	close(order)
	want := 0
	for got := range order {
		if got != want {
			t.Fatalf("granted to waiter %d, want %d (arrival order)", got, want)
		}
		want++
	}
}

// TestDeadWaiterLosesPlace: a queued waiter that dies (stops refreshing its
// place) does not block the queue for longer than its place lasts.
func TestDeadWaiterLosesPlace(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t, locks.Fair())
	holder, err := c.TryLock(ctx, "dead")
	if err != nil {
		t.Fatal(err)
	}
	// A waiter that died after queueing: an entry nobody will refresh.
	now := time.Now()
	rdb.ZAdd(ctx, "cg:q:{dead}", redis.Z{Score: 1, Member: "ghost|10000|ghostacq"})
	rdb.ZAdd(ctx, "cg:qt:{dead}", redis.Z{Score: float64(now.Add(500 * time.Millisecond).UnixMilli()), Member: "ghost|10000|ghostacq"})
	got := make(chan error, 1)
	go func() {
		lk, err := c.Lock(ctx, "dead", locks.WaitBudget(10*time.Second))
		if err == nil {
			lk.Unlock(ctx)
		}
		got <- err
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{dead}").Val() == 2 })
	holder.Unlock(ctx) // would hand to the ghost, whose place has expired or soon will
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(8 * time.Second):
		t.Fatal("a dead waiter blocked the queue")
	}
}

// TestManyDeadWaitersDoNotWedgeTheName: a fleet killed while thousands of
// callers queued for one name leaves more expired places than Lua can unpack
// into one command (about 8,000). Before, acquire.lua and release.lua dropped
// them with one ZREM of them all, which failed ("too many results to
// unpack") on every TryLock, Lock and Unlock of the name.
func TestManyDeadWaitersDoNotWedgeTheName(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t, locks.Logger(nil))
	const n = 10000
	// Places that expired a minute ago, in the layout acquire.lua documents.
	queueDead := func(name string) {
		t.Helper()
		nowMs := time.Now().UnixMilli()
		q, qt := make([]redis.Z, n), make([]redis.Z, n)
		for i := range n {
			m := fmt.Sprintf("owner%d|10000|client%d|acq%d", i, i, i)
			q[i] = redis.Z{Score: float64(nowMs*1000 - n + int64(i)), Member: m}
			qt[i] = redis.Z{Score: float64(nowMs - 60_000), Member: m}
		}
		if err := rdb.ZAdd(ctx, "cg:q:{"+name+"}", q...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, "cg:qt:{"+name+"}", qt...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, fair := range []bool{false, true} {
		name := fmt.Sprint("dead-free-", fair)
		queueDead(name)
		var opts []locks.CallOption
		if fair {
			opts = append(opts, locks.Fair())
		}
		lk, err := c.TryLock(ctx, name, opts...)
		if err != nil {
			t.Fatalf("TryLock of a free name with %d dead waiters (fair %v): %v", n, fair, err)
		}
		if q := rdb.ZCard(ctx, "cg:q:{"+name+"}").Val(); q != 0 {
			t.Errorf("fair %v: %d dead places left in the queue", fair, q)
		}
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Held: the holder's Unlock drops them (w set, as acquire.lua keeps it).
	name := "dead-held"
	lk, err := c.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	queueDead(name)
	rdb.HSet(ctx, "cg:lock:{"+name+"}", "w", "1")
	if err := lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock with %d dead waiters queued: %v", n, err)
	}
	if q := rdb.ZCard(ctx, "cg:q:{"+name+"}").Val(); q != 0 {
		t.Errorf("%d dead places left after the Unlock", q)
	}
	lk, err = c.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("TryLock after that Unlock: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestManyLocksBoundedCost(t *testing.T) {
	ctx := context.Background()
	n := 10000
	if testing.Short() {
		n = 2000
	}
	c, rdb, _ := newClient(t, locks.Lease(5*time.Second))
	before := runtime.NumGoroutine()
	held := make([]*locks.Lock, n)
	var wg sync.WaitGroup
	var failed atomic.Int64
	for w := range 16 {
		wg.Go(func() {
			for i := w; i < n; i += 16 {
				lk, err := c.TryLock(ctx, "many:"+strconv.Itoa(i))
				if err != nil {
					failed.Add(1)
					continue
				}
				held[i] = lk
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d acquisitions failed", failed.Load())
	}
	if c.Held() != n {
		t.Fatalf("Held() = %d, want %d", c.Held(), n)
	}
	if g := runtime.NumGoroutine() - before; g > 10 {
		t.Fatalf("holding %d locks costs %d goroutines", n, g)
	}
	if conns := rdb.PoolStats().TotalConns; conns > 40 {
		t.Fatalf("holding %d locks costs %d connections", n, conns)
	}
	// Survive at least one renewal round (every third of the lease).
	time.Sleep(2 * time.Second) // the subject is lease renewal over time
	lostCount := 0
	for _, lk := range held {
		select {
		case <-lk.Lost():
			lostCount++
		default:
		}
	}
	if lostCount > 0 {
		t.Fatalf("%d of %d locks lost while held", lostCount, n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, lk := range held {
		within(t, lk.Lost(), time.Second, "Lost after Close")
	}
	eventually(t, 5*time.Second, "goroutines stopped", func() bool { return runtime.NumGoroutine() <= before+2 })
}

func TestObserver(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	seen := map[locks.EventKind]int{}
	// A lease long enough that a stall of this shared machine cannot lose a
	// lock the test means to hold; Lost after the delete comes within a
	// renewal interval (a third of it).
	c, rdb, _ := newClient(t, locks.Lease(1500*time.Millisecond), locks.Observer(func(_ context.Context, e locks.Event) {
		mu.Lock()
		seen[e.Kind]++
		mu.Unlock()
	}))
	lk, err := c.TryLock(ctx, "obs")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(ctx, "obs"); !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("second TryLock = %v, want ErrNotObtained", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lk2, err := c.TryLock(ctx, "obs")
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, "cg:lock:{obs}")
	within(t, lk2.Lost(), 5*time.Second, "Lost")
	// The observer hears of the loss just after Lost closes.
	eventually(t, 5*time.Second, "the Lost event", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen[locks.EventLost] > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if seen[locks.EventAcquired] != 2 || seen[locks.EventNotObtained] != 1 || seen[locks.EventReleased] != 1 || seen[locks.EventLost] != 1 {
		t.Fatalf("events seen: %v", seen)
	}
}

func TestBadInputSendsNothing(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	hook := &redistest.CommandCounter{}
	rdb.AddHook(hook)
	c := locks.New(rdb)
	defer c.Close()
	cases := map[string]func() error{
		"empty name":      func() error { _, err := c.TryLock(ctx, ""); return err },
		"long name":       func() error { _, err := c.Lock(ctx, string(make([]byte, locks.MaxNameLen+1))); return err },
		"zero lease":      func() error { _, err := c.TryLock(ctx, "x", locks.Lease(0)); return err },
		"negative lease":  func() error { _, err := c.TryLock(ctx, "x", locks.Lease(-time.Second)); return err },
		"lease too short": func() error { _, err := c.TryLock(ctx, "x", locks.Lease(5*time.Millisecond)); return err },
		"negative wait":   func() error { _, err := c.Lock(ctx, "x", locks.WaitBudget(-1)); return err },
		"replicas no timeout": func() error {
			_, err := c.TryLock(ctx, "x", locks.Replicas(1, 0))
			return err
		},
		"optimistic nil client": func() error { return locks.Optimistic(ctx, nil, func(*redis.Tx) error { return nil }, []string{"k"}) },
		"optimistic nil fn":     func() error { return locks.Optimistic(ctx, rdb, nil, []string{"k"}) },
		"optimistic no keys":    func() error { return locks.Optimistic(ctx, rdb, func(*redis.Tx) error { return nil }, nil) },
		"nil client":            func() error { var nc *locks.Client; _, err := nc.TryLock(ctx, "x"); return err },
	}
	for name, f := range cases {
		if err := f(); !errors.Is(err, locks.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
	if n := hook.Count(); n != 0 {
		t.Fatalf("bad input sent %d commands to Redis", n)
	}
	for _, f := range []func(){
		func() { locks.New(nil) },
		func() { locks.New(rdb, locks.Lease(time.Millisecond)) },
		func() { locks.New(rdb, locks.Prefix("app{:")) },
		func() { locks.New(rdb, locks.Prefix("a{}:")) },
		func() { locks.New(rdb, locks.FenceRetention(time.Second)) },
		func() { locks.NewRedlock(nil) },
		func() { locks.NewRedlock([]redis.UniversalClient{rdb, nil}) },
		func() { locks.NewRedlock([]redis.UniversalClient{rdb, rdb}) },
		func() { locks.NewRedlock([]redis.UniversalClient{rdb}, locks.Drift(-1)) },
	} {
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Error("New or NewRedlock with bad arguments did not panic")
				}
			}()
			f()
		}()
	}
	c.Close()
	if _, err := c.TryLock(ctx, "x"); !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// TestHandOffCostsNoExtraRequest: a waiter handed the lock hears of it by
// push and sends nothing more until its first scheduled renewal — a
// contended acquisition costs its queued attempt and its release.
func TestHandOffCostsNoExtraRequest(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	holderRdb, waiterRdb := s.Client(), s.Client()
	hook := &redistest.CommandCounter{}
	waiterRdb.AddHook(hook)
	a := locks.New(holderRdb)
	defer a.Close()
	b := locks.New(waiterRdb)
	defer b.Close()
	held, err := a.TryLock(ctx, "handoff")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *locks.Lock, 1)
	go func() {
		lk, err := b.Lock(ctx, "handoff", locks.Fair())
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return holderRdb.ZCard(ctx, "cg:q:{handoff}").Val() == 1 })
	before := hook.Count()
	held.Unlock(ctx)
	var lk *locks.Lock
	select {
	case lk = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not handed the lock")
	}
	if lk == nil {
		t.FailNow()
	}
	// The subject is the renewal schedule: nothing is due for a while.
	time.Sleep(300 * time.Millisecond)
	if n := hook.Count() - before; n != 0 {
		t.Fatalf("the waiter sent %d commands between the hand-off and its first renewal, want 0", n)
	}
	lk.Unlock(ctx)
}

// TestReentryAfterHandOff: a lock handed to a waiter and then re-entered by
// the same owner counts two holds; the inner Unlock leaves it held, and no
// other owner gets in until the outer Unlock. (A hand-off used to mark the
// lock in a way that a later re-entry mistook for its own confirmation.)
func TestReentryAfterHandOff(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	a, b, c := locks.New(s.Client()), locks.New(s.Client()), locks.New(s.Client())
	defer a.Close()
	defer b.Close()
	defer c.Close()
	rdb := s.Client()
	held, err := a.Lock(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	owner := locks.WithOwner(ctx, locks.NewOwnerID())
	got := make(chan *locks.Lock, 1)
	go func() {
		l, err := b.Lock(owner, "x", locks.WaitBudget(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{x}").Val() == 1 })
	held.Unlock(ctx)
	outer := <-got
	if outer == nil {
		t.FailNow()
	}
	inner, err := b.Lock(owner, "x")
	if err != nil {
		t.Fatal(err)
	}
	if n := rdb.HGet(ctx, "cg:lock:{x}", "n").Val(); n != "2" {
		t.Fatalf("hold count after re-entering a handed-off lock = %q, want 2", n)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TryLock(ctx, "x"); !errors.Is(err, locks.ErrNotObtained) {
		t.Fatalf("another owner while the outer hold is held: %v, want ErrNotObtained", err)
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatalf("outer Unlock: %v", err)
	}
}

// TestSharedOwnerWaitersGetOneHoldEach: two callers waiting under one owner
// id are handed the lock one at a time — a grant names the acquisition, not
// only the owner.
func TestSharedOwnerWaitersGetOneHoldEach(t *testing.T) {
	ctx := context.Background()
	c, rdb, _ := newClient(t, locks.Fair())
	other, err := c.Lock(ctx, "shared")
	if err != nil {
		t.Fatal(err)
	}
	owner := locks.WithOwner(ctx, "job-7")
	got := make(chan *locks.Lock, 2)
	for i := range 2 {
		go func() {
			l, err := c.Lock(owner, "shared", locks.WaitBudget(10*time.Second))
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{shared}").Val() == int64(i+1) })
	}
	other.Unlock(ctx)
	first := <-got
	second := <-got // re-enters the first's hold, or is handed it after: either way its own hold
	if first == nil || second == nil {
		t.FailNow()
	}
	if n := rdb.HGet(ctx, "cg:lock:{shared}", "n").Val(); n != "2" {
		t.Fatalf("two holders under one owner: hold count %q, want 2", n)
	}
	first.Unlock(ctx)
	second.Unlock(ctx)
	if rdb.Exists(ctx, "cg:lock:{shared}").Val() != 0 {
		t.Fatal("lock left after both holds were given back")
	}
}

// Lock events balance: every Lock is counted once as it begins (Acquired,
// or Reentered for a nested hold of its owner's holding) and once as it ends
// (Released — an inner hold, the last one, or one whose release failed, with
// its error — or Lost), so a ginmw.Lock around a gormplugin.Transaction no
// longer counts two acquisitions for one release.
func TestLockEventsBalance(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	kinds := map[locks.EventKind]int{}
	var releaseErrs []error
	s := redistest.Start(t)
	c := locks.New(s.Client(), locks.Lease(300*time.Millisecond), locks.Observer(func(_ context.Context, e locks.Event) {
		mu.Lock()
		defer mu.Unlock()
		kinds[e.Kind]++
		if e.Kind == locks.EventReleased && e.Err != nil {
			releaseErrs = append(releaseErrs, e.Err)
		}
		if (e.Kind == locks.EventReleased || e.Kind == locks.EventLost) && e.Held <= 0 {
			t.Errorf("%v event without its hold time", e.Kind)
		}
	}))
	defer c.Close()
	// counts waits for the events to be as wanted: a Lost event follows the
	// Lost channel's closing.
	counts := func(want map[locks.EventKind]int) {
		t.Helper()
		match := func() bool {
			mu.Lock()
			defer mu.Unlock()
			for k, n := range want {
				if kinds[k] != n {
					return false
				}
			}
			return true
		}
		eventually(t, 5*time.Second, fmt.Sprintf("events %v", want), match)
	}
	octx := locks.WithOwner(ctx, "req")
	outer, err := c.Lock(octx, "ev")
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.Lock(octx, "ev")
	if err != nil {
		t.Fatal(err)
	}
	counts(map[locks.EventKind]int{locks.EventAcquired: 1, locks.EventReentered: 1, locks.EventReleased: 0})
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	counts(map[locks.EventKind]int{locks.EventReleased: 1})
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	counts(map[locks.EventKind]int{locks.EventAcquired: 1, locks.EventReentered: 1, locks.EventReleased: 2})

	// A lost lock ends once, as Lost; its Unlock adds nothing.
	lost, err := c.TryLock(ctx, "ev:lost")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Client().Del(ctx, "cg:lock:{ev:lost}").Err(); err != nil {
		t.Fatal(err)
	}
	within(t, lost.Lost(), 5*time.Second, "the deleted lock to count as lost")
	_ = lost.Unlock(ctx)
	counts(map[locks.EventKind]int{locks.EventAcquired: 2, locks.EventReleased: 2, locks.EventLost: 1})

	// An Unlock that failed ends its hold too: Released, with the error.
	lk, err := c.TryLock(ctx, "ev:failed")
	if err != nil {
		t.Fatal(err)
	}
	s.Kill()
	tctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if err := lk.Unlock(tctx); err == nil {
		t.Fatal("Unlock with the server down succeeded")
	}
	counts(map[locks.EventKind]int{locks.EventAcquired: 3, locks.EventReleased: 3, locks.EventLost: 1})
	mu.Lock()
	defer mu.Unlock()
	if len(releaseErrs) != 1 {
		t.Fatalf("Released events with an error: %v, want the failed Unlock's", releaseErrs)
	}
}

// A lock handed to a waiter with a fixed lease longer than the hand-off's
// claim gets its full lease at once (nothing would renew the claim).
func TestHandOffFixedLease(t *testing.T) {
	ctx := context.Background()
	c, rdb, s := newClient(t)
	b := locks.New(s.Client())
	defer b.Close()
	held, err := c.TryLock(ctx, "fixed-ho")
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *locks.Lock, 1)
	go func() {
		lk, err := b.Lock(ctx, "fixed-ho", locks.NoRenewal(), locks.Lease(6*time.Second), locks.WaitBudget(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{fixed-ho}").Val() == 1 })
	held.Unlock(ctx)
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	defer lk.Unlock(ctx)
	if pttl := rdb.PTTL(ctx, "cg:lock:{fixed-ho}").Val(); pttl < 4*time.Second {
		t.Fatalf("handed-off fixed lease: PTTL %v, want about the 6s lease (the claim is 2s)", pttl)
	}
	if ttl := lk.TTL(); ttl < 4*time.Second {
		t.Fatalf("handed-off fixed lease: TTL %v, want about 6s", ttl)
	}
}

// Warnings go to slog.Default() unless Logger names another logger (a
// discarding one silences them): a lock lost while held is logged once, where
// the configuration says.
func TestWarningsGoToSlogDefault(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	def, own := logtest.New(8), logtest.New(8)
	def.Default(t)
	for i, tc := range []struct {
		opts        []locks.Option
		want, quiet *logtest.Handler
	}{
		{nil, def, own},
		{[]locks.Option{locks.Logger(own.Logger())}, own, def},
	} {
		c := locks.New(s.Client(), tc.opts...)
		name := fmt.Sprintf("warned:%d", i)
		lk, err := c.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Client().Del(ctx, "cg:lock:{"+name+"}").Err(); err != nil {
			t.Fatal(err)
		}
		within(t, lk.Lost(), 5*time.Second, "the deleted lock to count as lost")
		if m := tc.want.Wait(t, 5*time.Second); !strings.Contains(m, "lock lost") {
			t.Fatalf("warning %q, want the lost lock", m)
		}
		tc.quiet.None(t)
		c.Close()
	}
}
