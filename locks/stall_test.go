package locks

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/rcmd"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// stallClient is a client of s whose commands wait for Redis as long as
// their context allows (no read or write timeout of its own): with Redis
// paused, a call ends only when its context does.
func stallClient(s *redistest.Server) *redis.Client {
	return s.Client(func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.ReadTimeout, o.WriteTimeout = -1, -1
		o.MaxRetries = -1
	})
}

// pause stops s (SIGSTOP) until resume is called; resume may be called
// again (deferred, for a test that ends early) and does nothing then.
func pause(s *redistest.Server) (resume func()) {
	s.Pause()
	var once sync.Once
	return func() { once.Do(s.Resume) }
}

// returnsWithin waits up to d for done and fails the test if it does not
// come: d is far beyond the bound the call must keep, so only a call that
// waits for the stall to end misses it.
func returnsWithin[T any](t *testing.T, done <-chan T, d time.Duration, what string) T {
	t.Helper()
	select {
	case v := <-done:
		return v
	case <-time.After(d):
		t.Fatalf("%s: still waiting %v later, with Redis paused", what, d)
	}
	var zero T
	return zero
}

// TestClaimedWaiterEndsWithItsContext: with Redis paused, an Unlock whose
// release claimed the next local waiter at the gate hangs on Redis; that
// waiter's Lock must still end when its own context does, not when the
// release returns. Once Redis answers, what the release did for the waiter
// (queued it, or handed it the lock) is given back: the lock is free again.
func TestClaimedWaiterEndsWithItsContext(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	p, x := New(stallClient(s)), New(s.Client())
	defer p.Close()
	defer x.Close()
	rdb := s.Client()
	held, err := x.TryLock(ctx, "claimed")
	if err != nil {
		t.Fatal(err)
	}
	a := make(chan *Lock, 1)
	go func() {
		lk, err := p.Lock(ctx, "claimed", WaitBudget(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		a <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "A queued", func() bool { return rdb.ZCard(ctx, "cg:q:{claimed}").Val() == 1 })
	bctx, cancelB := context.WithCancel(ctx)
	defer cancelB()
	b := make(chan error, 1)
	go func() {
		lk, err := p.Lock(bctx, "claimed", WaitBudget(10*time.Second))
		if err == nil {
			_ = lk.Unlock(ctx)
		}
		b <- err
	}()
	redistest.Eventually(t, 5*time.Second, "B at the gate", func() bool { return gateLen(p, "cg:lock:{claimed}") == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lkA := <-a
	if lkA == nil {
		t.FailNow()
	}

	resume := pause(s)
	defer resume()
	claimed := make(chan struct{})
	testHookClaimed = func() { close(claimed) }
	defer func() { testHookClaimed = nil }()
	unlocked := make(chan error, 1)
	uctx, cancelU := context.WithTimeout(ctx, time.Minute) // longer than the test: the release hangs on Redis
	defer cancelU()
	go func() { unlocked <- lkA.Unlock(uctx) }()
	returnsWithin(t, claimed, 10*time.Second, "A's release claiming B")
	start := time.Now()
	cancelB()
	err = returnsWithin(t, b, 5*time.Second, "B's Lock after its context ended")
	t.Logf("B returned %v after its context ended, Redis paused: %v", time.Since(start), err)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v, want context.Canceled", err)
	}

	resume()
	if err := returnsWithin(t, unlocked, 10*time.Second, "A's Unlock after Redis resumed"); err != nil {
		t.Logf("A's Unlock: %v", err)
	}
	redistest.Eventually(t, 10*time.Second, "the lock free again", func() bool {
		return rdb.Exists(ctx, "cg:lock:{claimed}", "cg:q:{claimed}").Val() == 0
	})
	lk, err := x.TryLock(ctx, "claimed")
	if err != nil {
		t.Fatalf("after B gave up: %v", err)
	}
	_ = lk.Unlock(ctx)
}

// holdFresh is a go-redis hook that holds the reply of the first fresh grant
// of name (acquire.lua answering a fence alone) until release is closed,
// telling held when it does.
type holdFresh struct {
	name    string
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (f *holdFresh) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *holdFresh) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f.maybeHold(cmd)
		return err
	}
}
func (f *holdFresh) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			f.maybeHold(cmd)
		}
		return err
	}
}
func (f *holdFresh) maybeHold(cmd redis.Cmder) {
	args := cmd.Args()
	c, ok := rcmd.AsCmd(cmd)
	if !ok || len(args) < 4 || (args[1] != acquireS.sha && args[1] != acquireLua) || args[3] != "cg:lock:{"+f.name+"}" {
		return
	}
	if _, fresh := c.Val().(string); !fresh {
		return
	}
	f.once.Do(func() {
		close(f.held)
		select {
		case <-f.release:
		case <-time.After(10 * time.Second):
		}
	})
}

// TestSameOwnerConcurrentFirstAcquire: two acquisitions by one owner of a
// free name race; the first to reach Redis takes the lock, the second
// re-enters it, but the second's reply is handled first. Both must hold the
// one holding (same fence, two holds), and after both Unlocks the lock must
// be gone: the late fresh grant once found the scope made by the re-entry,
// failed with ErrLost and marked the re-entry lost, whose Unlock then sent
// nothing, leaving the key with no holder until its lease ran out.
func TestSameOwnerConcurrentFirstAcquire(t *testing.T) {
	ctx := WithOwner(context.Background(), "same-owner")
	s := redistest.Start(t)
	rdb := s.Client()
	hook := &holdFresh{name: "twice", held: make(chan struct{}), release: make(chan struct{})}
	crdb := s.Client()
	crdb.AddHook(hook)
	c := New(crdb)
	defer c.Close()
	type result struct {
		lk  *Lock
		err error
	}
	first := make(chan result, 1)
	go func() {
		lk, err := c.TryLock(ctx, "twice")
		first <- result{lk, err}
	}()
	returnsWithin(t, hook.held, 10*time.Second, "the fresh grant")
	second, err := c.TryLock(ctx, "twice")
	close(hook.release)
	r1 := returnsWithin(t, first, 10*time.Second, "the first TryLock")
	if err != nil || r1.err != nil {
		t.Fatalf("first: %v, second (re-entry): %v; want both held", r1.err, err)
	}
	if r1.lk.Fence() != second.Fence() {
		t.Fatalf("fences %d and %d, want one holding", r1.lk.Fence(), second.Fence())
	}
	if n := rdb.HGet(context.Background(), "cg:lock:{twice}", "n").Val(); n != "2" {
		t.Fatalf("hold count %s, want 2", n)
	}
	for _, lk := range []*Lock{second, r1.lk} {
		select {
		case <-lk.Lost():
			t.Fatal("a Lock of the holding is lost")
		default:
		}
		if err := lk.Unlock(context.Background()); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
	}
	if n := rdb.Exists(context.Background(), "cg:lock:{twice}").Val(); n != 0 {
		t.Fatalf("the lock is still in Redis (pttl %v) after both Unlocks", rdb.PTTL(context.Background(), "cg:lock:{twice}").Val())
	}
}

// slowRelease is a go-redis hook that holds the reply of each release of key
// (release.lua) until a renewal (extend.lua) of key has found the key gone
// or taken over (it ran after the release), or for at most 700ms: a release reply delayed past the lease (300ms in
// the test).
type slowRelease struct {
	key      string
	mu       sync.Mutex
	after    chan struct{} // closed when a renewal is answered after a release ran (nil: none ran)
	renewals int
}

func (f *slowRelease) DialHook(next redis.DialHook) redis.DialHook { return next }
func (f *slowRelease) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f.seen([]redis.Cmder{cmd})
		return err
	}
}
func (f *slowRelease) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		f.seen(cmds)
		return err
	}
}
func (f *slowRelease) seen(cmds []redis.Cmder) {
	var wait chan struct{}
	for _, cmd := range cmds {
		args := cmd.Args()
		if len(args) < 4 || args[3] != f.key {
			continue
		}
		f.mu.Lock()
		switch args[1] {
		case releaseS.sha, releaseLua:
			if cmd.Err() == nil {
				f.after = make(chan struct{})
				wait = f.after
			}
		case extendS.sha, extendLua:
			if n, _ := cmd.(*redis.Cmd).Int64(); f.after != nil && n == 0 { // ran after the release
				f.renewals++
				select {
				case <-f.after:
				default:
					close(f.after)
				}
			}
		}
		f.mu.Unlock()
	}
	if wait != nil {
		select {
		case <-wait:
		case <-time.After(700 * time.Millisecond):
		}
	}
}

// TestCleanUnlockDoesNotCloseLost: an Unlock whose release succeeded never
// closes Lost, reports no Lost event and counts as Released, even when its
// reply comes after the lease would have run out and after a renewal sent
// meanwhile found the key gone (deleted by that very release, or handed to
// a waiter).
func TestCleanUnlockDoesNotCloseLost(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	for _, handOff := range []bool{false, true} {
		t.Run(map[bool]string{false: "released", true: "handed off"}[handOff], func(t *testing.T) {
			name := fmt.Sprintf("clean:%v", handOff)
			hook := &slowRelease{key: "cg:lock:{" + name + "}"}
			crdb := s.Client()
			crdb.AddHook(hook)
			var mu sync.Mutex
			kinds := map[EventKind]int{}
			c := New(crdb, CommandTimeout(2*time.Second), Observer(func(_ context.Context, e Event) {
				if e.Name == name {
					mu.Lock()
					kinds[e.Kind]++
					mu.Unlock()
				}
			}))
			defer c.Close()
			w := New(s.Client())
			defer w.Close()
			lk, err := c.TryLock(ctx, name, Lease(300*time.Millisecond))
			if err != nil {
				t.Fatal(err)
			}
			waited := make(chan error, 1)
			if handOff {
				go func() {
					wl, err := w.Lock(ctx, name, WaitBudget(10*time.Second))
					if err == nil {
						err = wl.Unlock(ctx)
					}
					waited <- err
				}()
				rdb := s.Client()
				redistest.Eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{"+name+"}").Val() == 1 })
			}
			if err := lk.Unlock(ctx); err != nil {
				t.Fatalf("Unlock: %v", err)
			}
			select {
			case <-lk.Lost():
				t.Errorf("a clean Unlock closed Lost (%d renewals answered after the release ran)", hook.renewals)
			default:
			}
			mu.Lock()
			got := maps.Clone(kinds)
			mu.Unlock()
			t.Logf("renewals answered after the release ran: %d; events %v", hook.renewals, got)
			if got[EventLost] != 0 || got[EventReleased] != 1 {
				t.Errorf("events %v, want 1 released and no lost", got)
			}
			if handOff {
				if err := returnsWithin(t, waited, 10*time.Second, "the waiter"); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestAttemptLostWithItsConnectionIsGivenBack: a direct attempt whose
// script ran but whose connection then broke (its reply never came, and the
// error is no timeout) may hold the lock; it must be given back, not left to
// hold the name for a whole lease with nobody to renew or release it.
func TestAttemptLostWithItsConnectionIsGivenBack(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	px, err := faultproxy.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = px.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	c := New(rdb)
	defer c.Close()
	admin := s.Client()
	warm, err := c.TryLock(ctx, "warm") // the server has the scripts: the next reply is the attempt's
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	holding := px.HoldNext()
	got := make(chan error, 1)
	go func() {
		lk, err := c.TryLock(ctx, "reset")
		if lk != nil {
			err = errors.New("got a lock through a reset connection")
		}
		got <- err
	}()
	returnsWithin(t, holding, 5*time.Second, "the attempt's reply held")
	if n := admin.Exists(ctx, "cg:lock:{reset}").Val(); n != 1 {
		t.Fatal("the attempt did not take the lock")
	}
	px.Set(faultproxy.Reset) // the connection breaks before the reply comes
	err = returnsWithin(t, got, 5*time.Second, "TryLock")
	t.Logf("TryLock: %v", err)
	if err == nil || rcmd.IsTimeout(err) {
		t.Fatalf("TryLock: %v, want a connection error that is no timeout", err)
	}
	px.Set(faultproxy.Pass)
	px.Release()
	redistest.Eventually(t, 5*time.Second, "the lock given back", func() bool {
		return admin.Exists(ctx, "cg:lock:{reset}").Val() == 0
	})
}

// dropBeforeExtend is a go-redis hook that deletes key (with admin) just
// before the first extend.lua call on it runs: a hand-off's claim that ran
// out before the waiter could set its lease.
type dropBeforeExtend struct {
	key   string
	admin *redis.Client
	once  sync.Once
}

func (d *dropBeforeExtend) DialHook(next redis.DialHook) redis.DialHook { return next }
func (d *dropBeforeExtend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		d.before([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (d *dropBeforeExtend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		d.before(cmds)
		return next(ctx, cmds)
	}
}
func (d *dropBeforeExtend) before(cmds []redis.Cmder) {
	for _, cmd := range cmds {
		if args := cmd.Args(); len(args) > 3 && (args[1] == extendS.sha || args[1] == extendLua) && args[3] == d.key {
			d.once.Do(func() { d.admin.Del(context.Background(), d.key) })
		}
	}
}

// TestFixedLeaseHandOffNotHeld: a waiter with a fixed lease (NoRenewal)
// handed the lock sets its lease at once; when Redis answers that it does
// not hold the lock (the claim ran out first), the hand-off is gone, and
// Lock must not return a Lock that Redis does not hold.
func TestFixedLeaseHandOffNotHeld(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	admin := s.Client()
	wrdb := s.Client()
	wrdb.AddHook(&dropBeforeExtend{key: "cg:lock:{fixed}", admin: admin})
	x, w := New(s.Client()), New(wrdb)
	defer x.Close()
	defer w.Close()
	held, err := x.TryLock(ctx, "fixed")
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lk  *Lock
		err error
	}
	got := make(chan result, 1)
	go func() {
		lk, err := w.Lock(ctx, "fixed", WaitBudget(10*time.Second), NoRenewal(), Lease(10*time.Second))
		got <- result{lk, err}
	}()
	redistest.Eventually(t, 5*time.Second, "waiter queued", func() bool { return admin.ZCard(ctx, "cg:q:{fixed}").Val() == 1 })
	if err := held.Unlock(ctx); err != nil { // hands the lock to w, with a claim lease
		t.Fatal(err)
	}
	r := returnsWithin(t, got, 10*time.Second, "the waiter")
	if r.err != nil {
		t.Logf("the waiter failed: %v", r.err)
		return
	}
	defer r.lk.Unlock(ctx)
	f, err := admin.HGet(ctx, "cg:lock:{fixed}", "f").Uint64()
	if err != nil || f != r.lk.Fence() {
		t.Fatalf("Lock returned a Lock with fence %d; Redis holds the lock with fence %d (%v)", r.lk.Fence(), f, err)
	}
}

// holdKeys is a go-redis hook that holds every command naming one of keys
// until open is closed, telling entered each time it holds one.
type holdKeys struct {
	keys    map[any]bool
	open    chan struct{}
	entered chan struct{}
}

func (h *holdKeys) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) > 3 && h.keys[args[3]] {
			h.entered <- struct{}{}
			<-h.open
		}
		return next(ctx, cmd)
	}
}
func (h *holdKeys) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestUnlockGivenUpWhileQueued: an Unlock whose context ends while its
// release waits in the batcher's queue (both direct slots busy) returns at
// once; the release still goes out when a slot frees (the lock must not be
// left to its lease), carrying the claimed next local waiter — who gave up
// meanwhile. What it is handed must be given back in the same stroke: once
// the batcher is idle the lock is free, not blocked by a claim nobody uses.
func TestUnlockGivenUpWhileQueued(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	h := &holdKeys{keys: map[any]bool{"cg:lock:{blocker1}": true, "cg:lock:{blocker2}": true}, open: make(chan struct{}), entered: make(chan struct{}, 2)}
	prdb := s.Client()
	prdb.AddHook(h)
	p, x := New(prdb, CommandTimeout(time.Minute)), New(s.Client())
	var once sync.Once
	open := func() { once.Do(func() { close(h.open) }) }
	defer p.Close()
	defer open()
	defer x.Close()
	rdb := s.Client()
	held, err := x.TryLock(ctx, "queued")
	if err != nil {
		t.Fatal(err)
	}
	a := make(chan *Lock, 1)
	go func() {
		lk, err := p.Lock(ctx, "queued", WaitBudget(10*time.Second))
		if err != nil {
			t.Error(err)
		}
		a <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "A queued", func() bool { return rdb.ZCard(ctx, "cg:q:{queued}").Val() == 1 })
	bctx, cancelB := context.WithCancel(ctx)
	defer cancelB()
	b := make(chan error, 1)
	go func() {
		lk, err := p.Lock(bctx, "queued", WaitBudget(10*time.Second))
		if err == nil {
			_ = lk.Unlock(ctx)
		}
		b <- err
	}()
	redistest.Eventually(t, 5*time.Second, "B at the gate", func() bool { return gateLen(p, "cg:lock:{queued}") == 1 })
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lkA := <-a
	if lkA == nil {
		t.FailNow()
	}

	// Both direct slots busy: the next calls queue.
	blocked := make(chan error, 2)
	for _, name := range []string{"blocker1", "blocker2"} {
		go func() {
			lk, err := p.TryLock(ctx, name)
			if err == nil {
				err = lk.Unlock(ctx)
			}
			blocked <- err
		}()
		returnsWithin(t, h.entered, 5*time.Second, name+" on the wire")
	}
	uctx, cancelU := context.WithCancel(ctx)
	unlocked := make(chan error, 1)
	testHookClaimed = func() {}
	defer func() { testHookClaimed = nil }()
	go func() { unlocked <- lkA.Unlock(uctx) }()
	redistest.Eventually(t, 5*time.Second, "A's release queued", func() bool { return p.Queued() == 1 })
	cancelB()
	cancelU()
	if err := returnsWithin(t, unlocked, 5*time.Second, "A's Unlock"); !errors.Is(err, context.Canceled) {
		t.Fatalf("A's Unlock: %v, want context.Canceled", err)
	}
	if err := returnsWithin(t, b, 5*time.Second, "B's Lock"); !errors.Is(err, context.Canceled) {
		t.Fatalf("B: %v, want context.Canceled", err)
	}
	open()
	for range 2 {
		if err := returnsWithin(t, blocked, 5*time.Second, "the blockers"); err != nil {
			t.Fatal(err)
		}
	}
	redistest.Eventually(t, 5*time.Second, "the batcher idle", func() bool {
		p.b.mu.Lock()
		defer p.b.mu.Unlock()
		return p.b.busy == 0 && len(p.b.queue) == 0 && len(p.b.retries) == 0
	})
	if n := rdb.Exists(ctx, "cg:lock:{queued}", "cg:q:{queued}").Val(); n != 0 {
		t.Fatalf("with the batcher idle, the lock is held by %q (pttl %v): handed to a waiter that gave up",
			rdb.HGet(ctx, "cg:lock:{queued}", "o").Val(), rdb.PTTL(ctx, "cg:lock:{queued}").Val())
	}
}

// TestGiveBackDuringCloseLeavesItsCaller: Close ends a waiting Lock, whose
// place in the lock's queue is then given back under the caller's context.
// With Redis paused, that give-back hangs; the Lock must return when its
// context ends all the same, not when the give-back does (it used to be sent
// detached from the caller's context, and the Lock returned a command timeout
// late). What is left is sent off the caller's goroutine, and Close returns
// once it was: the place is gone then.
func TestGiveBackDuringCloseLeavesItsCaller(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	p, x := New(stallClient(s), CommandTimeout(time.Minute)), New(s.Client())
	defer x.Close()
	rdb := s.Client()
	held, err := x.TryLock(ctx, "giveback")
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := p.Lock(lctx, "giveback", WaitBudget(time.Minute))
		waited <- err
	}()
	redistest.Eventually(t, 5*time.Second, "the waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{giveback}").Val() == 1 })

	resume := pause(s)
	defer resume()
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	err = returnsWithin(t, waited, 10*time.Second, "the waiting Lock after Close and its context, its give-back hanging")
	if !errors.Is(err, ErrClosed) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock: %v, want ErrClosed or its context's error", err)
	}
	resume()
	returnsWithin(t, closed, 10*time.Second, "Close after Redis resumed")
	if n := rdb.ZCard(ctx, "cg:q:{giveback}").Val(); n != 0 {
		t.Fatalf("%d places left in the queue after Close returned", n)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestUnlockDuringCloseKeepsItsContext: an Unlock whose release hangs on a
// paused Redis while the client closes fails when its context ends, and
// returns then: the release it would send again is dropped, as Close drops
// the clean-ups queued (the lock expires with its lease). It used to be sent
// again on the caller's goroutine, detached from its context, once the client
// had closed, and the Unlock returned a command timeout late. Close returns
// within the bound of a round trip already on the wire (the release, when the
// batch carrying it left before Close began: two command timeouts).
func TestUnlockDuringCloseKeepsItsContext(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	const timeout = 5 * time.Second // the Unlock's context ends 3s before it
	p := New(stallClient(s), CommandTimeout(timeout))
	lk, err := p.TryLock(ctx, "unlock-during-close", Lease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	resume := pause(s)
	defer resume()
	unlocked := make(chan error, 1)
	go func() {
		uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		unlocked <- lk.Unlock(uctx)
	}()
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	err = returnsWithin(t, unlocked, 4*time.Second, "an Unlock during Close, its context ended, Redis paused")
	t.Logf("Unlock: %v", err)
	returnsWithin(t, closed, 2*timeout+2*time.Second, "Close, Redis paused")
	resume()
	redistest.Eventually(t, 10*time.Second, "the lock expired with its lease", func() bool {
		return s.Client().Exists(ctx, "cg:lock:{unlock-during-close}").Val() == 0
	})
}

// TestNoLeaseAfterHoldEnded: commands of a hold that reach Redis late never
// leave its name locked with nobody holding it. Here an Extend shortens the
// hold's lease while Redis is paused, and a longer Extend waits behind it; the
// hold ends at the short lease's deadline, before Redis resumes. The longer
// Extend must not be sent then (it was, and set its lease when Redis
// resumed), and the hold is given back: the name is free once Redis is back.
// (TestGenLocks found the class: a hold's clean-up stopped at its local
// deadline while a request of the hold, written into the stall, ran later.)
func TestNoLeaseAfterHoldEnded(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	c := New(stallClient(s), CommandTimeout(200*time.Millisecond))
	defer c.Close()
	rdb := s.Client()
	defer rdb.Close()
	name := "stalled-extend"
	lk, err := c.Lock(ctx, name, Lease(time.Minute), NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	resume := pause(s)
	defer resume()
	extended := make(chan error, 2)
	go func() { extended <- lk.Extend(ctx, 150*time.Millisecond) }() // written into the stall
	redistest.Eventually(t, 5*time.Second, "the short Extend on the wire", func() bool { return lk.TTL() < time.Second })
	go func() { extended <- lk.Extend(ctx, 2*time.Minute) }() // waits for the wire
	for range 2 {
		if err := returnsWithin(t, extended, 10*time.Second, "an Extend in the stall"); err == nil {
			t.Fatal("Extend succeeded with Redis paused")
		}
	}
	returnsWithin(t, lk.Lost(), 10*time.Second, "the hold's end at its short lease")
	resume()
	redistest.Eventually(t, 10*time.Second, "the lock free after Redis resumed", func() bool {
		return rdb.Exists(ctx, "cg:lock:{"+name+"}").Val() == 0
	})
}
