package locks

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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
	cfg := &c.cfg
	first, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, "")
	if err != nil || !first.ok {
		t.Fatalf("first attempt: %+v %v", first, err)
	}
	again, err := c.attempt(ctx, ks, boxKeys(ks), "owner-1", "acq-1", cfg, "")
	if err != nil || !again.ok || again.fence != first.fence || again.reentered {
		t.Fatalf("retried attempt: %+v %v, want the same fresh grant of fence %d", again, err, first.fence)
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
	cfg := &c.cfg
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
func (c *Client) releaseRaw(ctx context.Context, kv []any, owner, acq any, cfg *config, mine any) (int64, error) {
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
	cfg := &c.cfg
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
			lk, err := c.Lock(ctx, "solo", WaitBudget(10*time.Second))
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

// acquireCounter counts the acquire.lua calls a client sends.
type acquireCounter struct{ n atomic.Int64 }

func (a *acquireCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (a *acquireCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		a.count(cmd)
		return next(ctx, cmd)
	}
}
func (a *acquireCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			a.count(c)
		}
		return next(ctx, cmds)
	}
}
func (a *acquireCounter) count(cmd redis.Cmder) {
	if args := cmd.Args(); len(args) > 1 && (args[1] == acquireS.sha || args[1] == acquireLua) {
		a.n.Add(1)
	}
}

// TestReleaseQueuesNextLocalWaiter: the Unlock of a lock granted after
// waiting queues its process's next waiter in Redis in the release script,
// so that waiter's wait costs no call of its own: handed the lock at once
// when nobody else waits, or later by push when another process is ahead.
func TestReleaseQueuesNextLocalWaiter(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	var ac acquireCounter
	prdb := s.Client()
	prdb.AddHook(&ac)
	p, x, y := New(prdb), New(s.Client()), New(s.Client())
	defer p.Close()
	defer x.Close()
	defer y.Close()
	rdb := s.Client()

	for _, other := range []bool{false, true} {
		name := fmt.Sprintf("next:%v", other)
		q := "cg:q:{" + name + "}"
		held, err := x.TryLock(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		type result struct {
			lk  *Lock
			err error
		}
		a, b := make(chan result, 1), make(chan result, 1)
		lock := func(out chan result) {
			lk, err := p.Lock(ctx, name, WaitBudget(10*time.Second))
			out <- result{lk, err}
		}
		go lock(a)
		redistest.Eventually(t, 5*time.Second, "A queued", func() bool { return rdb.ZCard(ctx, q).Val() == 1 })
		go lock(b)
		redistest.Eventually(t, 5*time.Second, "B at the gate", func() bool { return gateLen(p, "cg:lock:{"+name+"}") == 1 })
		var ywait chan result
		if other {
			ywait = make(chan result, 1)
			go func() {
				lk, err := y.Lock(ctx, name, WaitBudget(10*time.Second))
				ywait <- result{lk, err}
			}()
			redistest.Eventually(t, 5*time.Second, "Y queued", func() bool { return rdb.ZCard(ctx, q).Val() == 2 })
		}
		before := ac.n.Load()
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		ra := <-a
		if ra.err != nil {
			t.Fatal(ra.err)
		}
		pubs := publishCalls(t, rdb)
		if err := ra.lk.Unlock(ctx); err != nil { // queues B (behind Y when other)
			t.Fatal(err)
		}
		// Only another process's waiter is told by a push: B learns of its
		// grant from the release's reply.
		if n, want := publishCalls(t, rdb)-pubs, map[bool]int{false: 0, true: 1}[other]; n != want {
			t.Fatalf("other process waiting %v: A's release published %d grants, want %d", other, n, want)
		}
		if other {
			ry := <-ywait
			if ry.err != nil {
				t.Fatal(ry.err)
			}
			if err := ry.lk.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		rb := <-b
		if rb.err != nil {
			t.Fatal(rb.err)
		}
		if rb.lk.Fence() <= ra.lk.Fence() {
			t.Fatalf("B's fence %d not above A's %d", rb.lk.Fence(), ra.lk.Fence())
		}
		if n := ac.n.Load() - before; n != 0 {
			t.Fatalf("other process waiting %v: B sent %d acquire calls, want 0 (queued by A's release)", other, n)
		}
		if err := rb.lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if rdb.Exists(ctx, "cg:lock:{"+name+"}", q).Val() != 0 {
			t.Fatal("lock or queue left behind")
		}
	}
}

// TestNextWaiterGivesUpWhileQueuedForIt: a waiter whose wait ends while the
// release that queues it is on the wire gives back what was done for it, so
// the lock is not left to a waiter that is gone.
func TestNextWaiterGivesUpWhileQueuedForIt(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	p, x := New(s.Client()), New(s.Client())
	defer p.Close()
	defer x.Close()
	rdb := s.Client()
	held, err := x.TryLock(ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	a := make(chan *Lock, 1)
	go func() {
		lk, err := p.Lock(ctx, "gone", WaitBudget(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		a <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "A queued", func() bool { return rdb.ZCard(ctx, "cg:q:{gone}").Val() == 1 })
	bctx, cancelB := context.WithCancel(ctx)
	b := make(chan error, 1)
	go func() {
		_, err := p.Lock(bctx, "gone", WaitBudget(10*time.Second))
		b <- err
	}()
	redistest.Eventually(t, 5*time.Second, "B at the gate", func() bool { return gateLen(p, "cg:lock:{gone}") == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lkA := <-a
	if lkA == nil {
		t.FailNow()
	}
	testHookClaimed = cancelB // B gives up once A's release has claimed it
	defer func() { testHookClaimed = nil }()
	if err := lkA.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-b; !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v, want context.Canceled", err)
	}
	// B was handed the lock by A's release, and gave it back.
	redistest.Eventually(t, 5*time.Second, "lock free again", func() bool {
		return rdb.Exists(ctx, "cg:lock:{gone}", "cg:q:{gone}").Val() == 0
	})
	lk, err := x.TryLock(ctx, "gone")
	if err != nil {
		t.Fatalf("after B gave up: %v", err)
	}
	lk.Unlock(ctx)
}

// publishCalls is how many PUBLISH commands the server has run, scripts'
// included (INFO commandstats).
func publishCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	_, v, ok := strings.Cut(info, "cmdstat_publish:calls=")
	if !ok {
		return 0
	}
	n, _ := strconv.Atoi(v[:strings.IndexByte(v, ',')])
	return n
}

// gateLen is how many callers of c wait at its gate for the lock key.
func gateLen(c *Client, key string) int {
	c.mu.Lock()
	g := c.gates[key]
	c.mu.Unlock()
	if g == nil {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// TestHandOffClaimIsTheWaitersOwn: a hand-off's lease in Redis is the claim
// the waiter counts with (the shorter of its own lease and the queue-place
// ttl), whatever the releaser's lease: a releaser with a shorter lease once
// set its own, and the waiter then believed it held the lock for longer than
// Redis kept it.
func TestHandOffClaimIsTheWaitersOwn(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	x, w := New(s.Client()), New(s.Client())
	defer x.Close()
	defer w.Close()
	rdb := s.Client()
	held, err := x.TryLock(ctx, "claim", Lease(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock, 1)
	go func() {
		lk, err := w.Lock(ctx, "claim", WaitBudget(10*time.Second), Lease(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		got <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{claim}").Val() == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lk := <-got
	if lk == nil {
		t.FailNow()
	}
	defer lk.Unlock(ctx)
	pttl := rdb.PTTL(ctx, "cg:lock:{claim}").Val()
	if local := lk.TTL(); local > pttl+50*time.Millisecond {
		t.Fatalf("the holder counts %v left, Redis keeps the lock %v", local, pttl)
	}
}

// TestNextWaiterAfterUnnoticedExpiry: when the lease of a lock that keeps
// its process's turn ran out unnoticed (nobody took the lock since), the
// Unlock counts as a release but queues nobody; the next local waiter must
// then try at once, not sleep as if queued (it would outlast a short wait).
func TestNextWaiterAfterUnnoticedExpiry(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	p, x := New(s.Client()), New(s.Client())
	defer p.Close()
	defer x.Close()
	rdb := s.Client()
	held, err := x.TryLock(ctx, "lapsed")
	if err != nil {
		t.Fatal(err)
	}
	a := make(chan *Lock, 1)
	go func() {
		lk, err := p.Lock(ctx, "lapsed", WaitBudget(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		a <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "A queued", func() bool { return rdb.ZCard(ctx, "cg:q:{lapsed}").Val() == 1 })
	b := make(chan error, 1)
	go func() {
		lk, err := p.Lock(ctx, "lapsed", WaitBudget(300*time.Millisecond))
		if err == nil {
			err = lk.Unlock(ctx)
		}
		b <- err
	}()
	redistest.Eventually(t, 5*time.Second, "B at the gate", func() bool { return gateLen(p, "cg:lock:{lapsed}") == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lkA := <-a
	if lkA == nil {
		t.FailNow()
	}
	rdb.Del(ctx, "cg:lock:{lapsed}") // A's lease ran out unnoticed; its fence is still the latest
	if err := lkA.Unlock(ctx); err != nil {
		t.Fatalf("A's Unlock: %v, want nil (nobody held the lock meanwhile)", err)
	}
	if err := <-b; err != nil {
		t.Fatalf("B: %v, want the free lock within its 300ms wait", err)
	}
}

// TestRefusedHoldLeavesItsSiblings: an Extend that Redis refuses because
// that one hold is gone — its own release overtook it, or a Redlock's nodes
// lost it while the owner's other holds stand — loses that Lock alone: the
// owner's other Lock of the name keeps it, and no other owner gets the name
// before it lets go. (Any refusal used to lose the whole scope and give it
// back: TestGenRedlock found another owner granted the name 321 ms before
// the lease of a hold its owner had not let go of.)
func TestRefusedHoldLeavesItsSiblings(t *testing.T) {
	bg := context.Background()
	ctx := WithOwner(bg, "owner-a")
	check := func(t *testing.T, l Locker, drop func(y *Lock), viaUnlock bool) {
		x, err := l.Lock(ctx, "sibling", Lease(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		y, err := l.Lock(ctx, "sibling", Lease(2*time.Second)) // re-enters
		if err != nil {
			t.Fatal(err)
		}
		drop(y) // as y's release does when it overtakes y's Extend
		if viaUnlock {
			_ = y.Unlock(bg) // its release finds the hold gone, the owner's other there
		} else if err := y.Extend(bg, 3*time.Second); !errors.Is(err, ErrNotHeld) {
			t.Fatalf("Extend of the hold Redis lost: %v, want ErrNotHeld", err)
		}
		select {
		case <-x.Lost():
			t.Fatal("the owner's other Lock was lost with it")
		default:
		}
		if ttl := x.TTL(); ttl <= 0 {
			t.Fatalf("the owner's other Lock: TTL %v", ttl)
		}
		if other, err := l.TryLock(bg, "sibling"); err == nil {
			_ = other.Unlock(bg)
			t.Fatal("another owner was granted the name its owner still holds")
		}
		if err := x.Unlock(bg); err != nil {
			t.Fatalf("Unlock of the other Lock: %v", err)
		}
		_ = y.Unlock(bg) // the scope ends with its last Lock
	}
	t.Run("client", func(t *testing.T) {
		rdb := redistest.Start(t).Client()
		c := New(rdb)
		defer c.Close()
		for _, viaUnlock := range []bool{false, true} {
			check(t, c, func(y *Lock) {
				key := y.h.keys[0]
				rdb.HDel(bg, key, "h:"+y.h.acqv.(string))
				rdb.HIncrBy(bg, key, "n", -1)
			}, viaUnlock)
		}
	})
	t.Run("redlock", func(t *testing.T) {
		servers := redistest.StartN(t, 3)
		clients := make([]redis.UniversalClient, len(servers))
		for i, s := range servers {
			clients[i] = s.Client()
		}
		r := NewRedlock(clients)
		defer r.Close()
		for _, viaUnlock := range []bool{false, true} {
			check(t, r, func(y *Lock) {
				for _, c := range clients {
					c.HDel(bg, y.h.keys[0], y.h.keys[1])
				}
			}, viaUnlock)
		}
	})
}

// TestRedlockLateExtendNeverShortens: an extend of a Redlock acquisition that
// reaches a node after a newer one of the same holder (its reply never came:
// held in a stall, or retried by go-redis) does not shorten the lease the
// newer one set there. (It did: TestGenRedlock at 10x found a node cut to
// 200 ms by such an extend 40 ms after Extend(900ms) had succeeded, the Lock
// reporting 610 ms of validity while one node of three kept it, and another
// owner granted the name.)
func TestRedlockLateExtendNeverShortens(t *testing.T) {
	bg := context.Background()
	servers := redistest.StartN(t, 3)
	clients := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		clients[i] = s.Client()
	}
	r := NewRedlock(clients, NoRenewal())
	defer r.Close()
	lk, err := r.Lock(bg, "late-extend", Lease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lk.h.mu.Lock()
	lk.h.seq++ // a command took the wire (this number) and its call ended without a reply
	older := lk.h.seq
	lk.h.mu.Unlock()
	if err := lk.Extend(bg, 3*time.Second); err != nil { // numbered after it
		t.Fatal(err)
	}
	// Extend returns once a quorum confirmed: those nodes applied it (the
	// others' commands may still be on their way, or were cut by the node
	// timeout on a busy host). The late one goes to a node that applied it.
	node := slices.IndexFunc(clients, func(c redis.UniversalClient) bool { return c.PTTL(bg, lk.h.keys[0]).Val() > 2*time.Second })
	if node < 0 {
		t.Fatal("Extend(3s) succeeded, yet no node keeps the lock for more than 2s")
	}
	late := clients[node].Eval(bg, redlockExtendS.Source(), []string{lk.h.keys[0]}, lk.h.owner, lk.h.keys[1], 200, older)
	if n, err := late.Int64(); err != nil || n != 1 {
		t.Fatalf("the late extend: %d %v, want 1 (overtaken, the lease left is longer)", n, err)
	}
	if pttl := clients[node].PTTL(bg, lk.h.keys[0]).Val(); pttl < 2*time.Second {
		t.Fatalf("after a late 200ms extend node %d keeps the lock %v, want what Extend(3s) set", node, pttl)
	}
	_ = lk.Unlock(bg)
}
