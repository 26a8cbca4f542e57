package locks

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/faultproxy"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// wireHook is a go-redis hook that sees every command of a client, sent on
// its own or in a pipeline: before runs before the command is sent (it may
// hold it), after once its reply came (it may hold the reply back from the
// caller). Either may be nil.
type wireHook struct {
	before func(cmd redis.Cmder)
	after  func(cmd redis.Cmder)
}

func (w *wireHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (w *wireHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return w.around([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}
func (w *wireHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return w.around(cmds, func() error { return next(ctx, cmds) })
	}
}
func (w *wireHook) around(cmds []redis.Cmder, send func() error) error {
	if w.before != nil {
		for _, c := range cmds {
			w.before(c)
		}
	}
	err := send()
	if len(cmds) == 1 && err != nil && cmds[0].Err() == nil {
		cmds[0].SetErr(err) // go-redis sets it only once the hooks returned
	}
	if w.after != nil {
		for _, c := range cmds {
			w.after(c)
		}
	}
	return err
}

// scriptCall reports which of the package's scripts cmd runs (nil for
// another command) and its first key.
func scriptCall(cmd redis.Cmder) (s *script, key string) {
	args := cmd.Args()
	if len(args) < 4 {
		return nil, ""
	}
	key, _ = args[3].(string)
	for _, sc := range []*script{&acquireS, &releaseS, &extendS, &redlockAcquireS, &redlockReleaseS, &redlockExtendS} {
		if args[1] == sc.sha || args[1] == sc.Script.Source() {
			return sc, key
		}
	}
	return nil, ""
}

// checkTTL fails when l's TTL exceeds what Redis has left of the lock key
// (beyond the round trip that read it): the holder would believe it holds a
// lock Redis may give away.
func checkTTL(t *testing.T, rdb *redis.Client, l *Lock, key, when string) {
	t.Helper()
	start := time.Now()
	ttl := l.TTL()
	pttl := rdb.PTTL(context.Background(), key).Val()
	rtt := time.Since(start)
	if ttl > pttl+rtt+2*time.Millisecond {
		t.Errorf("%s: TTL() %v while Redis keeps the key %v more (read in %v)", when, ttl, pttl, rtt)
	}
}

// TestHandOffCountsFromQueueing (issue 46, item 1): a waiter queued in Redis
// by its process's release, and handed the lock by another process's release
// before that first release's reply came, counts its claim from no later
// than its queueing: its TTL never exceeds Redis's.
func TestHandOffCountsFromQueueing(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "handoff-late"
	lockKey := "cg:lock:{" + name + "}"
	var slow atomic.Bool
	var delayed atomic.Pointer[redis.Cmder] // chosen when sent: W may be handed the lock before the reply is read
	prdb := s.Client()
	prdb.AddHook(&wireHook{before: func(cmd redis.Cmder) {
		if sc, key := scriptCall(cmd); sc == &releaseS && key == lockKey && slow.Load() {
			delayed.Store(&cmd)
		}
	}, after: func(cmd redis.Cmder) {
		if d := delayed.Load(); d != nil && *d == cmd {
			time.Sleep(400 * time.Millisecond) // the fault: the release's reply is slow (less than a third of the 2 s claim: B is not confirmed, it counts)
		}
	}})
	p, x, w := New(prdb), New(s.Client()), New(s.Client())
	defer p.Close()
	defer x.Close()
	defer w.Close()
	rdb := s.Client()

	hx, err := x.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	aDone := make(chan *Lock, 1)
	go func() {
		lk, err := p.Lock(ctx, name)
		if err != nil {
			t.Error(err)
		}
		aDone <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "the awaited state", func() bool { return rdb.ZCard(ctx, "cg:q:{"+name+"}").Val() == 1 })
	wDone := make(chan *Lock, 1)
	go func() {
		lk, err := w.Lock(ctx, name)
		if err != nil {
			t.Error(err)
		}
		wDone <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "the awaited state", func() bool { return rdb.ZCard(ctx, "cg:q:{"+name+"}").Val() == 2 })
	if err := hx.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-aDone
	if a == nil {
		t.FailNow()
	}
	bDone := make(chan *Lock, 1)
	go func() {
		lk, err := p.Lock(ctx, name)
		if err != nil {
			t.Error(err)
		}
		bDone <- lk
	}()
	redistest.Eventually(t, 5*time.Second, "the awaited state", func() bool { return gateLen(p, lockKey) == 1 })
	slow.Store(true)
	go func() { _ = a.Unlock(ctx) }() // queues B behind W, hands the lock to W; its reply is slow
	wl := <-wDone
	if wl == nil {
		t.FailNow()
	}
	slow.Store(false)                      // B's own commands are not delayed
	if err := wl.Unlock(ctx); err != nil { // hands the lock to B before A's reply came
		t.Fatal(err)
	}
	b := <-bDone
	if b == nil {
		t.FailNow()
	}
	defer b.Unlock(ctx)
	checkTTL(t, rdb, b, lockKey, "B handed the lock")
}

// TestExtendWithRenewalOnTheWire (issue 46, item 2): a background renewal
// carrying the old lease that reaches Redis after Extend never leaves the
// holder counting the extended lease while Redis keeps the old one.
func TestExtendWithRenewalOnTheWire(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "extend-renew"
	lockKey := "cg:lock:{" + name + "}"
	renewalHeld := make(chan struct{})
	extended := make(chan struct{})
	var once sync.Once
	crdb := s.Client()
	var extendedOnce sync.Once
	crdb.AddHook(&wireHook{before: func(cmd redis.Cmder) {
		args := cmd.Args()
		if sc, key := scriptCall(cmd); sc == &extendS && key == lockKey && len(args) > 5 && args[5] == int64(600) {
			first := false
			once.Do(func() { first = true })
			if first {
				close(renewalHeld)
				select { // the fault: the renewal reaches Redis after Extend's command, if Extend does not wait for it
				case <-extended:
				case <-time.After(150 * time.Millisecond):
				}
			}
		}
	}, after: func(cmd redis.Cmder) {
		args := cmd.Args()
		if sc, key := scriptCall(cmd); sc == &extendS && key == lockKey && len(args) > 5 && args[5] == int64(6000) {
			extendedOnce.Do(func() { close(extended) })
		}
	}})
	c := New(crdb)
	defer c.Close()
	rdb := s.Client()
	lk, err := c.TryLock(ctx, name, Lease(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock(ctx)
	select {
	case <-renewalHeld:
	case <-time.After(5 * time.Second):
		t.Fatal("no renewal sent")
	}
	if err := lk.Extend(ctx, 6*time.Second); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(time.Second); time.Now().Before(end); {
		checkTTL(t, rdb, lk, lockKey, "after Extend and a renewal")
		if t.Failed() {
			return
		}
		time.Sleep(20 * time.Millisecond) // sampling TTL against PTTL, not synchronisation
	}
}

// TestSameOwnerWaiterReenters (issue 46, item 3): two callers of one owner
// wait for a name another process holds; once the first is granted, the
// second re-enters the owner's holding instead of waiting for itself.
func TestSameOwnerWaiterReenters(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "same-owner"
	lockKey := "cg:lock:{" + name + "}"
	p, x := New(s.Client()), New(s.Client())
	defer p.Close()
	defer x.Close()
	hx, err := x.TryLock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	octx := WithOwner(ctx, "owner-46")
	got := make(chan error, 2)
	var mu sync.Mutex
	var lks []*Lock
	for range 2 {
		go func() {
			lk, err := p.Lock(octx, name, WaitBudget(2*time.Second))
			if err == nil {
				mu.Lock()
				lks = append(lks, lk)
				mu.Unlock()
			}
			got <- err
		}()
	}
	redistest.Eventually(t, 5*time.Second, "the awaited state", func() bool { return gateLen(p, lockKey) == 1 })
	if err := hx.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-got; err != nil {
			t.Errorf("a caller of the owner that holds the lock: %v", err)
		}
	}
	for _, lk := range lks {
		if err := lk.Unlock(ctx); err != nil {
			t.Error(err)
		}
	}
}

// TestBreakerClosesOnSlowLink (issue 46, item 5): after a black hole trips
// the breaker, a link that heals slow (a fresh connection taking longer than
// a Cooldown to dial and greet) still closes it within two Cooldowns plus a
// round trip of a fresh connection.
func TestBreakerClosesOnSlowLink(t *testing.T) {
	s := redistest.Start(t)
	px, err := faultproxy.New(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1, DialTimeout: 5 * time.Second})
	defer rdb.Close()
	b := &Breaker{}
	rdb.AddHook(b)
	c := New(rdb)
	defer c.Close()
	ctx := context.Background()
	if lk, err := c.TryLock(ctx, "slow-link"); err != nil {
		t.Fatal(err)
	} else {
		_ = lk.Unlock(ctx)
	}
	px.Set(faultproxy.BlackHole)
	for i := 0; i < 50 && !b.Open(); i++ {
		_, _ = c.TryLock(ctx, "slow-link")
	}
	if !b.Open() {
		t.Fatal("breaker not open in a black hole")
	}
	px.SetLatency(80 * time.Millisecond) // a 160ms round trip; a fresh connection takes several
	px.Set(faultproxy.Latency)
	healed := time.Now()
	redistest.Eventually(t, 5*time.Second, "the awaited state", func() bool { return !b.Open() })
	t.Logf("breaker closed %v after the link healed", time.Since(healed).Round(time.Millisecond))
}

// TestNestedCallDuringCloseHonoursContext (issue 46, item 6): while Close
// waits for an acquisition stuck on a stalled Redis, a nested acquisition
// under WithOwner returns when its context ends.
func TestNestedCallDuringCloseHonoursContext(t *testing.T) {
	s := redistest.Start(t)
	sent := make(chan struct{}, 1)
	crdb := s.Client()
	crdb.AddHook(&wireHook{before: func(cmd redis.Cmder) {
		if sc, key := scriptCall(cmd); sc == &acquireS && key == "cg:lock:{stuck-on-stall}" {
			sent <- struct{}{}
		}
	}})
	c := New(crdb, CommandTimeout(2*time.Second))
	ctx := context.Background()
	octx := WithOwner(ctx, "owner-close")
	outer, err := c.TryLock(octx, "nested-close")
	if err != nil {
		t.Fatal(err)
	}
	_ = outer
	s.Pause()
	defer s.Resume()
	stuck := make(chan struct{})
	go func() {
		defer close(stuck)
		_, _ = c.TryLock(ctx, "stuck-on-stall")
	}()
	closed := make(chan struct{})
	<-sent
	go func() {
		defer close(closed)
		_ = c.Close()
	}()
	redistest.Eventually(t, 5*time.Second, "the awaited state", c.Closing)
	nctx, cancel := context.WithTimeout(octx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = c.TryLock(nctx, "nested-close")
	took := time.Since(start)
	if took > 600*time.Millisecond {
		t.Errorf("a nested TryLock with a 200ms context returned after %v (%v)", took, err)
	}
	s.Resume()
	<-stuck
	<-closed
}

// endEvents counts acquisitions begun (Acquired, Reentered) and ended
// (Released, Lost), as an observer sees them.
type endEvents struct {
	mu          sync.Mutex
	begun, ends int
}

func (e *endEvents) observe(_ context.Context, ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch ev.Kind {
	case EventAcquired, EventReentered:
		e.begun++
	case EventReleased, EventLost:
		e.ends++
	}
}

func (e *endEvents) counts() (int, int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.begun, e.ends
}

// TestScopedUnlockOfGoneLockEnds (issue 46, item 7): a Lock under WithOwner
// whose key was deleted and taken by another process ends, when Unlock finds
// it gone, with one end event (Client and Redlock alike).
func TestScopedUnlockOfGoneLockEnds(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	for _, kind := range []string{"client", "redlock"} {
		t.Run(kind, func(t *testing.T) {
			ev := &endEvents{}
			var l, other Locker
			var held func() int
			var key string
			name := "scoped-gone-" + kind
			switch kind {
			case "client":
				c := New(s.Client(), Observer(ev.observe))
				defer c.Close()
				o := New(s.Client())
				defer o.Close()
				l, other, held, key = c, o, c.Held, "cg:lock:{"+name+"}"
			default:
				r := NewRedlock([]redis.UniversalClient{s.Client()}, Observer(ev.observe))
				defer r.Close()
				o := NewRedlock([]redis.UniversalClient{s.Client()})
				defer o.Close()
				l, other, held, key = r, o, r.ren.len, redlockKey("cg:", name)
			}
			lk, err := l.Lock(WithOwner(ctx, "owner-gone"), name)
			if err != nil {
				t.Fatal(err)
			}
			rdb.Del(ctx, key)
			if _, err := other.TryLock(ctx, name); err != nil {
				t.Fatal(err)
			}
			if err := lk.Unlock(ctx); !errors.Is(err, ErrNotHeld) {
				t.Fatalf("Unlock: %v, want ErrNotHeld", err)
			}
			if begun, ends := ev.counts(); begun != 1 || ends != 1 {
				t.Errorf("%d acquisitions, %d end events", begun, ends)
			}
			if n := held(); n != 0 {
				t.Errorf("Held() = %d after Unlock", n)
			}
			select {
			case <-lk.Lost():
			default:
				t.Error("Lost() open after Unlock found the lock gone")
			}
		})
	}
}

// TestShorterExtendCountsFromItsSend (found by TestGenLocks): an Extend to
// a shorter lease than is left applies in Redis before its reply comes
// back (or when it never comes): from its send on, the holder counts no more
// than the lease it carries.
func TestShorterExtendCountsFromItsSend(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "extend-shorter"
	lockKey := "cg:lock:{" + name + "}"
	applied := make(chan struct{})
	resume := make(chan struct{})
	var once sync.Once
	crdb := s.Client()
	crdb.AddHook(&wireHook{after: func(cmd redis.Cmder) {
		args := cmd.Args()
		if sc, key := scriptCall(cmd); sc == &extendS && key == lockKey && len(args) > 5 && args[5] == int64(300) && cmd.Err() == nil {
			once.Do(func() {
				close(applied)
				<-resume // the fault: the reply is slow
			})
		}
	}})
	c := New(crdb)
	defer c.Close()
	rdb := s.Client()
	lk, err := c.TryLock(ctx, name, Lease(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- lk.Extend(ctx, 300*time.Millisecond) }()
	<-applied
	checkTTL(t, rdb, lk, lockKey, "Extend(300ms) applied, its reply on the way")
	close(resume)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
}

// TestStaleRenewalSparesOwnersNextHolding (found by TestGenLocks on a
// cluster): a renewal of an owner's holding that reaches Redis after that
// holding was released and the owner took the lock afresh never touches the
// new holding's lease.
func TestStaleRenewalSparesOwnersNextHolding(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "stale-renewal"
	lockKey := "cg:lock:{" + name + "}"
	renewalHeld := make(chan struct{})
	retaken := make(chan struct{})
	renewed := make(chan struct{})
	var once, after sync.Once
	crdb := s.Client()
	isRenewal := func(cmd redis.Cmder) bool {
		args := cmd.Args()
		sc, key := scriptCall(cmd)
		return sc == &extendS && key == lockKey && len(args) > 5 && args[5] == int64(200)
	}
	crdb.AddHook(&wireHook{before: func(cmd redis.Cmder) {
		if isRenewal(cmd) {
			once.Do(func() {
				close(renewalHeld)
				select { // the fault: the renewal reaches Redis late
				case <-retaken:
				case <-time.After(2 * time.Second):
				}
			})
		}
	}, after: func(cmd redis.Cmder) {
		if isRenewal(cmd) {
			after.Do(func() { close(renewed) })
		}
	}})
	c := New(crdb)
	defer c.Close()
	rdb := s.Client()
	octx := WithOwner(ctx, "owner-stale")
	a, err := c.TryLock(octx, name, Lease(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-renewalHeld
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := c.TryLock(octx, name, Lease(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Unlock(ctx)
	close(retaken)
	<-renewed
	checkTTL(t, rdb, b, lockKey, "after the earlier holding's renewal landed")
}

// TestRenewalAfterLostIsReleased: a renewal whose reply comes after the lock
// was lost at its local deadline has kept the key a lease more in Redis; it
// is released then, not left to block the name for that lease.
func TestRenewalAfterLostIsReleased(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "renewal-after-lost"
	lockKey := "cg:lock:{" + name + "}"
	var lost <-chan struct{}
	var ready = make(chan struct{})
	var once sync.Once
	crdb := s.Client()
	crdb.AddHook(&wireHook{after: func(cmd redis.Cmder) {
		if sc, key := scriptCall(cmd); sc == &extendS && key == lockKey && cmd.Err() == nil {
			once.Do(func() {
				<-ready
				select { // the fault: the reply comes after the local deadline
				case <-lost:
				case <-time.After(5 * time.Second):
				}
			})
		}
	}})
	c := New(crdb)
	defer c.Close()
	rdb := s.Client()
	lk, err := c.TryLock(ctx, name, Lease(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lost = lk.Lost()
	close(ready)
	<-lost
	redistest.Eventually(t, 500*time.Millisecond, "the key released after the late renewal", func() bool {
		return rdb.Exists(ctx, lockKey).Val() == 0
	})
}

// retryHook re-sends the next acquire.lua call of its client after running
// between (as go-redis retrying a call whose reply was lost, with another
// command of the same owner reaching Redis in between).
type retryHook struct {
	mu      sync.Mutex
	armed   bool
	between func()
}

func (r *retryHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *retryHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return r.around([]redis.Cmder{cmd}, func() error { return next(ctx, cmd) })
	}
}
func (r *retryHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		return r.around(cmds, func() error { return next(ctx, cmds) })
	}
}
func (r *retryHook) around(cmds []redis.Cmder, send func() error) error {
	r.mu.Lock()
	fire := false
	for _, c := range cmds {
		if sc, _ := scriptCall(c); sc == &acquireS && r.armed {
			fire, r.armed = true, false
		}
	}
	r.mu.Unlock()
	if !fire {
		return send()
	}
	_ = send()
	r.between()
	return send()
}

// TestRetriedReentryStaysReentry: a re-entry whose call is retried after
// the owner's first Lock was Unlocked (its release reached Redis between the
// call and its retry) is still the re-entry the first call's reply said: the
// nested Lock gets the holding and its fence as a re-entry, not as a fresh
// grant of that fence (the hold count it read before was 1, a fresh grant's;
// TestGenLocks found it as "fence granted twice").
func TestRetriedReentryStaysReentry(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	hook := &retryHook{}
	rdb.AddHook(hook)
	var mu sync.Mutex
	kinds := map[EventKind]int{}
	c := New(rdb, Observer(func(_ context.Context, e Event) {
		mu.Lock()
		kinds[e.Kind]++
		mu.Unlock()
	}))
	defer c.Close()
	name := "retried-reentry"
	octx := WithOwner(ctx, "owner-r")
	l1, err := c.Lock(octx, name)
	if err != nil {
		t.Fatal(err)
	}
	unlocked := make(chan error, 1)
	hook.mu.Lock()
	hook.armed = true
	hook.between = func() { unlocked <- l1.Unlock(ctx) }
	hook.mu.Unlock()
	l2, err := c.Lock(octx, name)
	if err != nil {
		t.Fatalf("re-entry whose retry came after the first Lock's Unlock: %v", err)
	}
	if err := <-unlocked; err != nil {
		t.Errorf("the first Lock's Unlock: %v", err)
	}
	if l2.Fence() != l1.Fence() {
		t.Errorf("re-entry's fence %d, want the holding's %d", l2.Fence(), l1.Fence())
	}
	mu.Lock()
	if kinds[EventAcquired] != 1 || kinds[EventReentered] != 1 {
		t.Errorf("events %v: want one acquisition and one re-entry", kinds)
	}
	mu.Unlock()
	if err := l2.Unlock(ctx); err != nil {
		t.Error(err)
	}
	if rdb.Exists(ctx, "cg:lock:{"+name+"}").Val() != 0 {
		t.Error("lock left after both Unlocks")
	}
}

// holdLate has f hold back l's next call of sc until deliver is closed,
// after loading l's scripts (a held-back EVALSHA then runs when it arrives).
func holdLate(t *testing.T, l Locker, f *genFault, sc *script) (deliver chan struct{}) {
	t.Helper()
	warmUp(t, l)
	deliver = make(chan struct{})
	f.set(&genRule{script: sc, mode: "late", until: deliver, left: 1})
	return deliver
}

// warmUp takes and releases a lock with l, so that Redis knows its scripts:
// the next call of a script is one EVALSHA (no NOSCRIPT, then EVAL).
func warmUp(t *testing.T, l Locker) {
	t.Helper()
	warm, err := l.TryLock(context.Background(), "warm-up")
	if err != nil {
		t.Fatal(err)
	}
	if err := warm.Unlock(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestLateAttemptAfterGiveBack: an attempt whose request reaches Redis only
// after its caller gave up and its give-back ran (written into a stall, served
// after the give-back's own connection) takes nothing: the name is free for
// the next caller at once, not after the attempt's lease with nobody holding
// it.
func TestLateAttemptAfterGiveBack(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "late-after-giveback"
	lockKey := "cg:lock:{" + name + "}"
	gaveBack, arrived := make(chan struct{}), make(chan struct{})
	var backOnce, lateOnce sync.Once
	prdb := s.Client()
	f := &genFault{}
	prdb.AddHook(f)
	prdb.AddHook(&wireHook{after: func(cmd redis.Cmder) { // sees what f lets through
		switch sc, key := scriptCall(cmd); {
		case key != lockKey || cmd.Err() != nil:
		case sc == &releaseS:
			backOnce.Do(func() { close(gaveBack) })
		case sc == &acquireS:
			lateOnce.Do(func() { close(arrived) })
		}
	}})
	p, x := New(prdb), New(s.Client())
	defer p.Close()
	defer x.Close()
	rdb := s.Client()
	defer rdb.Close()

	deliver := holdLate(t, p, f, &acquireS)
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := p.TryLock(tctx, name)
	cancel()
	if err == nil {
		t.Fatal("TryLock succeeded with its request held back")
	}
	select {
	case <-gaveBack:
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt was not given back")
	}
	redistest.Eventually(t, 5*time.Second, "every clean-up sent", func() bool {
		p.b.mu.Lock()
		defer p.b.mu.Unlock()
		return p.b.busy == 0 && len(p.b.queue) == 0 && len(p.b.retries) == 0
	})
	close(deliver)
	select {
	case <-arrived: // the held request has reached Redis, after the give-back
	case <-time.After(10 * time.Second):
		t.Fatal("the held request never reached Redis")
	}
	f.wg.Wait()
	if pttl := rdb.PTTL(ctx, lockKey).Val(); pttl > 0 {
		t.Errorf("the given-back attempt took the lock for %v when its request came late", pttl)
	}
	lk, err := x.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("the next caller: %v", err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Error(err)
	}
}

// TestRefusedRetryGivesBack: go-redis sends a command again after its reply
// was lost (MaxRetries, 3 on this client) and reports the last attempt's
// error alone. An acquire that ran, whose retry Redis refused (READONLY,
// after a failover), is given back: the name is free for the next caller at
// once, not after the attempt's lease (30s) with nobody holding it. An error
// reply used to say that the acquire never ran.
func TestRefusedRetryGivesBack(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "refused-retry"
	lockKey := "cg:lock:{" + name + "}"
	var armed atomic.Bool
	prdb := s.Client()
	prdb.AddHook(redistest.Intercept(func(_ context.Context, cmds []redis.Cmder, send func() error) error {
		err := send()
		for _, cmd := range cmds {
			if sc, key := scriptCall(cmd); sc == &acquireS && key == lockKey && cmd.Err() == nil && armed.CompareAndSwap(true, false) {
				err = replyError("READONLY You can't write against a read only replica.")
				cmd.SetErr(err)
			}
		}
		return err
	}))
	p, x := New(prdb), New(s.Client())
	defer p.Close()
	defer x.Close()
	warmUp(t, p)
	armed.Store(true)
	if lk, err := p.TryLock(ctx, name, Lease(30*time.Second)); err == nil {
		t.Fatalf("TryLock succeeded (%v) with its reply refused", lk)
	}
	if armed.Load() {
		t.Fatal("the acquire to refuse was not sent")
	}
	var lk *Lock
	redistest.Eventually(t, 5*time.Second, "the name free for another caller", func() bool {
		var err error
		lk, err = x.TryLock(ctx, name)
		return err == nil
	})
	if err := lk.Unlock(ctx); err != nil {
		t.Error(err)
	}
}

// replyError is an error reply of Redis's.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// TestRedlockLateAttemptAfterItsLease: an attempt that failed (its requests
// to two nodes held back) is given back; its requests reach those nodes after
// the attempt's lease, while its owner holds the lock anew, and add no hold
// there. The tombstones lived for the attempt's lease only: the requests
// re-entered the new holding, which then outlived its Unlock by its whole
// lease with nobody holding it (TestGenRedlock at scale 2).
func TestRedlockLateAttemptAfterItsLease(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 3)
	name := "rl-late-after-lease"
	key := "cg:rlock:{" + name + "}"
	var clients, plain []redis.UniversalClient
	var faults []*genFault
	for i, s := range servers {
		c := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
		defer c.Close()
		if i < 2 {
			f := &genFault{}
			c.AddHook(f)
			faults = append(faults, f)
		}
		clients = append(clients, c)
		pc := s.Client()
		defer pc.Close()
		plain = append(plain, pc)
	}
	r := NewRedlock(clients, NodeTimeout(100*time.Millisecond))
	defer r.Close()
	x, y := NewRedlock(plain), NewRedlock(plain)
	defer x.Close()
	defer y.Close()
	octx := WithOwner(ctx, "owner-late")
	warmUp(t, r)
	deliver := make(chan struct{})
	for _, f := range faults {
		f.set(&genRule{script: &redlockAcquireS, mode: "late", until: deliver, left: 1})
	}
	tctx, cancel := context.WithTimeout(octx, 50*time.Millisecond)
	_, err := r.TryLock(tctx, name, Lease(100*time.Millisecond))
	cancel()
	if err == nil {
		t.Fatal("TryLock succeeded with two of three requests held back")
	}
	for i := range 2 {
		redistest.Eventually(t, 5*time.Second, fmt.Sprintf("node %d's clean-ups sent", i), func() bool {
			_, _, idle := r.NodeQueue(i)
			return idle
		})
	}
	time.Sleep(300 * time.Millisecond) // the fault: the requests stay on the wire past the attempt's lease
	held, err := x.Lock(octx, name, Lease(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	close(deliver)
	for _, f := range faults {
		f.wg.Wait() // the held requests have been answered
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range plain {
		if pttl := c.PTTL(ctx, key).Val(); pttl > 0 {
			t.Errorf("node %d keeps the lock %v after its owner's Unlock: the late request added a hold", i, pttl)
		}
	}
	lk, err := y.TryLock(ctx, name)
	if err != nil {
		t.Fatalf("another owner after the Unlock: %v", err)
	}
	_ = lk.Unlock(ctx)
}

// TestExpiredHoldGivenBack: a hold that ends at its local deadline is given
// back, where Redis keeps it longer — here because its owner re-entered with
// a longer lease, and that inner hold was Unlocked since: nobody holds the
// lock, and the next caller gets it before that longer lease ends.
func TestExpiredHoldGivenBack(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	c, x := New(s.Client()), New(s.Client())
	defer c.Close()
	defer x.Close()
	name := "expired-hold"
	octx := WithOwner(ctx, "owner-e")
	outer, err := c.Lock(octx, name, Lease(200*time.Millisecond), NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.Lock(octx, name, Lease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-outer.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the outer hold outlived its fixed lease")
	}
	var lk *Lock
	redistest.Eventually(t, 10*time.Second, "the name free after the last hold's lease", func() bool {
		lk, err = x.TryLock(ctx, name)
		return err == nil
	})
	if err := lk.Unlock(ctx); err != nil {
		t.Error(err)
	}
}

// TestRedlockLateAttemptAfterRelease is TestLateAttemptAfterGiveBack for
// Redlock: a node's acquire request that reaches the node only after the
// holding was released there (it was granted by the other nodes meanwhile,
// and Unlocked) takes nothing on that node.
func TestRedlockLateAttemptAfterRelease(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 3)
	name := "rl-late-after-release"
	key := "cg:rlock:{" + name + "}"
	arrived := make(chan struct{})
	var lateOnce sync.Once
	f := &genFault{}
	var clients []redis.UniversalClient
	for i, s := range servers {
		c := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
		defer c.Close()
		if i == 0 {
			c.AddHook(f)
			c.AddHook(&wireHook{after: func(cmd redis.Cmder) { // sees what f lets through
				if sc, k := scriptCall(cmd); sc == &redlockAcquireS && k == key && cmd.Err() == nil {
					lateOnce.Do(func() { close(arrived) })
				}
			}})
		}
		clients = append(clients, c)
	}
	r := NewRedlock(clients, NodeTimeout(100*time.Millisecond))
	defer r.Close()
	deliver := holdLate(t, r, f, &redlockAcquireS)
	lk, err := r.TryLock(ctx, name) // nodes 1 and 2 grant
	if err != nil {
		t.Fatal(err)
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	redistest.Eventually(t, 5*time.Second, "node 0's clean-ups sent", func() bool {
		_, _, idle := r.NodeQueue(0)
		return idle
	})
	close(deliver)
	select {
	case <-arrived: // the held request has reached node 0, after the release
	case <-time.After(10 * time.Second):
		t.Fatal("the held request never reached node 0")
	}
	f.wg.Wait()
	node0 := servers[0].Client()
	defer node0.Close()
	if pttl := node0.PTTL(ctx, key).Val(); pttl > 0 {
		t.Errorf("node 0 keeps the released acquisition for %v: its request came late", pttl)
	}
}

// TestRedlockLostHoldKeptToExpiry: a Redlock hold lost at its local
// deadline (its validity: lease − drift) is not given back before the nodes
// would expire it themselves. The holder stops at its deadline; the drift
// allowance is the margin between that and the next holder's start, and a
// give-back sent at the deadline would take that margin away.
func TestRedlockLostHoldKeptToExpiry(t *testing.T) {
	ctx := context.Background()
	servers := redistest.StartN(t, 3)
	var clients []redis.UniversalClient
	for _, s := range servers {
		c := s.Client()
		defer c.Close()
		clients = append(clients, c)
	}
	const lease = time.Second
	a := NewRedlock(clients, Drift(300*time.Millisecond))
	defer a.Close()
	b := NewRedlock(clients)
	defer b.Close()
	name := "rl-lost-kept"
	called := time.Now()
	lk, err := a.Lock(ctx, name, Lease(lease), NoRenewal())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(10 * time.Second):
		t.Fatal("the hold outlived its fixed lease")
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	next, err := b.Lock(wctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if got := time.Since(called); got < lease {
		t.Errorf("the next holder was granted %v after the first one's call, within its lease %v", got, lease)
	}
	if err := next.Unlock(ctx); err != nil {
		t.Error(err)
	}
}

// TestRedlockRacingFirstAcquisitionsOfOneOwner: two first acquisitions of a
// name by one owner in one process reach the nodes in different orders (one
// node down): each began the owner's holding on one node and re-entered it on
// the other. Both are of that one holding: neither may lose it, nor give the
// name back while the owner holds it.
func TestRedlockRacingFirstAcquisitionsOfOneOwner(t *testing.T) {
	ctx := WithOwner(context.Background(), "racer")
	servers := redistest.StartN(t, 3)
	var clients []redis.UniversalClient
	var faults []*genFault
	for _, s := range servers {
		c := s.Client()
		defer c.Close()
		f := &genFault{}
		c.AddHook(f)
		faults = append(faults, f)
		clients = append(clients, c)
	}
	r := NewRedlock(clients, NodeTimeout(400*time.Millisecond))
	defer r.Close()
	name := "rl-racers"
	servers[0].Pause()
	defer servers[0].Resume()
	// The first attempt reaches node 2 after the second: node 1 sees the
	// first, then the second; node 2 the second, then the first.
	rule := &genRule{script: &redlockAcquireS, mode: "delay", d: 100 * time.Millisecond, left: 1}
	faults[2].set(rule)
	type got struct {
		lk  *Lock
		err error
	}
	first := make(chan got, 1)
	go func() {
		lk, err := r.TryLock(ctx, name, Lease(5*time.Second))
		first <- got{lk, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; { // until the first attempt is held back on its way to node 2
		faults[2].mu.Lock()
		held := rule.left == 0
		faults[2].mu.Unlock()
		if held {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first attempt never reached node 2")
		}
		runtime.Gosched()
	}
	second, err := r.TryLock(ctx, name, Lease(5*time.Second))
	a := <-first
	for _, g := range []got{a, {second, err}} {
		if g.err != nil {
			t.Fatalf("an acquisition of the owner's holding failed: %v", g.err)
		}
		if g.lk.TTL() <= 0 {
			t.Errorf("an acquisition of the owner's holding was lost: %v", g.lk.h.lostErr())
		}
	}
	other, err := r.TryLock(context.Background(), name)
	if err == nil {
		_ = other.Unlock(context.Background())
		t.Fatal("another owner was granted the name the owner holds")
	}
	for _, lk := range []*Lock{a.lk, second} {
		if lk != nil {
			_ = lk.Unlock(context.Background())
		}
	}
}

// TestGrantReadAfterItsLeaseGrantsNothing (found by ginmw's TestGenLock): an
// acquisition whose reply arrives only after its lease ran out on the local
// clock is not handed to the caller, a Lock it would not hold (TTL 0, lost
// at once, a handler run without it): it is given back and fails with
// ErrNoValidity, a service failure (ErrUnavailable), as a Redlock quorum
// reached too late does.
func TestGrantReadAfterItsLeaseGrantsNothing(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "late-grant"
	lockKey := "cg:lock:{" + name + "}"
	crdb, _ := lateFirstAcquire(s, name, 150*time.Millisecond)
	c := New(crdb)
	defer c.Close()
	lk, err := c.TryLock(ctx, name, Lease(100*time.Millisecond))
	if err == nil {
		ttl := lk.TTL()
		_ = lk.Unlock(ctx)
		t.Fatalf("TryLock granted a Lock read 150ms after its 100ms lease (TTL %v)", ttl)
	}
	if !errors.Is(err, ErrNoValidity) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryLock: %v, want ErrNoValidity and ErrUnavailable", err)
	}
	if n := s.Client().Exists(ctx, lockKey).Val(); n != 0 {
		t.Fatalf("the late grant was not given back: Redis keeps the lock (%v left)", s.Client().PTTL(ctx, lockKey).Val())
	}
	lk, err = c.TryLock(ctx, name) // the next attempt, not late, is granted
	if err != nil {
		t.Fatal(err)
	}
	_ = lk.Unlock(ctx)
}

// TestHandOffAfterLongWaitIsHeld: a waiter whose lease is shorter than its
// sleep between attempts is handed the lock by another process's release; it
// cannot know when that release ran, only that it ran after the waiter's last
// attempt, long ago: the hand-off is confirmed before Lock returns, and the
// caller holds the lock for its lease — not a Lock already spent
// (ErrNoValidity) or lost an instant later.
func TestHandOffAfterLongWaitIsHeld(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	name := "handoff-short-lease"
	lockKey, placesKey := "cg:lock:{"+name+"}", "cg:qt:{"+name+"}"
	a, b := New(s.Client()), New(s.Client())
	defer a.Close()
	defer b.Close()
	held, err := a.Lock(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	const lease = 200 * time.Millisecond
	type result struct {
		lk  *Lock
		err error
		ttl time.Duration
	}
	done := make(chan result, 1)
	go func() {
		lk, err := b.Lock(ctx, name, Lease(lease))
		r := result{lk: lk, err: err}
		if err == nil {
			r.ttl = lk.TTL()
		}
		done <- r
	}()
	// B queued, then its lease's worth of Redis's time passed since (its
	// place's deadline is its queueing + placeTTL): the hand-off comes
	// after B's own claim would have run out, counted from its attempt.
	redistest.Eventually(t, 5*time.Second, "B queued", func() bool { return rdb.ZCard(ctx, placesKey).Val() == 1 })
	queuedAt := rdb.ZRangeWithScores(ctx, placesKey, 0, 0).Val()[0].Score - float64(placeTTL.Milliseconds())
	redistest.Eventually(t, 5*time.Second, "B's lease passed since it queued", func() bool {
		now := rdb.Time(ctx).Val()
		return float64(now.UnixMilli()) > queuedAt+float64(lease.Milliseconds())
	})
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("B was handed the lock and Lock failed: %v", r.err)
	}
	if r.ttl <= 0 {
		t.Fatalf("B's Lock had TTL %v when Lock returned it", r.ttl)
	}
	checkTTL(t, rdb, r.lk, lockKey, "B handed the lock")
	if pttl := rdb.PTTL(ctx, lockKey).Val(); pttl <= 0 {
		t.Fatalf("Redis keeps B's lock %v", pttl)
	}
	if err := r.lk.Context().Err(); err != nil {
		t.Fatalf("B's Lock was lost: %v", context.Cause(r.lk.Context()))
	}
	if err := r.lk.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

// TestLockAsksAgainAfterSpentGrant: a waiting Lock whose grant came back
// after its lease ran out gives it back and asks again within its wait
// budget (a Redlock's Lock does the same); TryLock makes one attempt and
// fails (TestGrantReadAfterItsLeaseGrantsNothing).
func TestLockAsksAgainAfterSpentGrant(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	name := "late-grant-lock"
	lockKey := "cg:lock:{" + name + "}"
	crdb, late := lateFirstAcquire(s, name, 150*time.Millisecond)
	c := New(crdb)
	defer c.Close()
	lk, err := c.Lock(ctx, name, Lease(100*time.Millisecond), WaitBudget(5*time.Second))
	if err != nil {
		t.Fatalf("Lock: %v (a late grant should have been asked for again)", err)
	}
	defer lk.Unlock(ctx)
	if n := late.Load(); n < 2 {
		t.Fatalf("%d acquisition attempts: the late one was not the first", n)
	}
	if ttl := lk.TTL(); ttl <= 0 {
		t.Fatalf("Lock returned with TTL %v", ttl)
	}
	checkTTL(t, s.Client(), lk, lockKey, "granted on the second attempt")
}

// lateFirstAcquire returns a client of s whose first acquire.lua reply for
// name is read d late (the fault: the grant's reply is late), and the count
// of its acquire replies.
func lateFirstAcquire(s *redistest.Server, name string, d time.Duration) (*redis.Client, *atomic.Int32) {
	lockKey := "cg:lock:{" + name + "}"
	var n atomic.Int32
	crdb := s.Client()
	crdb.AddHook(&wireHook{after: func(cmd redis.Cmder) {
		if sc, key := scriptCall(cmd); sc == &acquireS && key == lockKey && n.Add(1) == 1 {
			time.Sleep(d)
		}
	}})
	return crdb, &n
}
