package locks_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/locks"
)

// waitErr waits (bounded) for one result on ch.
func waitErr(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s: no result within %v", what, d)
		return nil
	}
}

// Close ends a waiting Lock at once with ErrClosed, and withdraws its place
// in the lock's queue, so the holder's release goes to another process at
// once instead of to the closed waiter. (A waiting Lock used to go on after
// Close, polling, and return a held lock with a nil error.)
func TestCloseEndsWaiters(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	a, c := locks.New(s.Client()), locks.New(s.Client())
	defer a.Close()
	defer c.Close()
	for _, mode := range []string{"default", "fair"} {
		t.Run(mode, func(t *testing.T) {
			var opts []locks.Option
			if mode == "fair" {
				opts = append(opts, locks.Fair())
			}
			b := locks.New(s.Client(), opts...)
			defer b.Close()
			held, err := a.TryLock(ctx, "closing")
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan error, 1)
			go func() {
				lk, err := b.Lock(ctx, "closing", locks.WaitBudget(20*time.Second))
				if lk != nil {
					err = errors.Join(errors.New("got a lock"), err)
				}
				got <- err
			}()
			eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{closing}").Val() == 1 })
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			err = waitErr(t, got, time.Second, "waiting Lock after Close")
			if !errors.Is(err, locks.ErrClosed) || !errors.Is(err, locks.ErrNotObtained) {
				t.Fatalf("waiting Lock after Close: %v, want ErrClosed", err)
			}
			if n := rdb.ZCard(ctx, "cg:q:{closing}").Val(); n != 0 {
				t.Fatalf("%d places left in the queue after Close", n)
			}
			if err := held.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// Not handed to the closed waiter: free for anyone at once.
			lk, err := c.TryLock(ctx, "closing")
			if err != nil {
				t.Fatalf("after the holder's release: %v", err)
			}
			lk.Unlock(ctx)
		})
	}
}

// keyGate holds the first command that names key until open is closed.
type keyGate struct {
	key     string
	open    chan struct{}
	entered chan struct{}
	once    sync.Once
}

func (h *keyGate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *keyGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if slices.Contains(cmd.Args(), any(h.key)) {
			h.once.Do(func() {
				h.entered <- struct{}{}
				<-h.open
			})
		}
		return next(ctx, cmd)
	}
}

func (h *keyGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// A grant that arrives while Close runs is given back, and the call fails
// with ErrClosed; Close returns once the call has.
func TestCloseGivesBackGrant(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client()
	h := &keyGate{key: "cg:lock:{granted-late}", open: make(chan struct{}), entered: make(chan struct{}, 1)}
	gated := s.Client()
	gated.AddHook(h)
	c := locks.New(gated)
	var once sync.Once
	open := func() { once.Do(func() { close(h.open) }) }
	t.Cleanup(func() { open(); c.Close() })

	got := make(chan error, 1)
	go func() {
		lk, err := c.TryLock(ctx, "granted-late")
		if lk != nil {
			err = errors.Join(errors.New("got a lock"), err)
		}
		got <- err
	}()
	select {
	case <-h.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("attempt not sent")
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	eventually(t, 5*time.Second, "client closing", c.Closing)
	open() // the attempt reaches Redis now, and takes the lock
	if err := waitErr(t, got, 5*time.Second, "TryLock"); !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("TryLock granted during Close: %v, want ErrClosed", err)
	}
	waitErr(t, closed, 5*time.Second, "Close")
	if rdb.Exists(ctx, "cg:lock:{granted-late}").Val() != 0 {
		t.Fatal("the grant that arrived during Close was not given back")
	}
}

// Shutdown is the graceful close: waiting calls end with ErrClosed (their
// queue places withdrawn), new calls fail, locks still held stay renewed
// while the application finishes with them, and Shutdown returns once they
// are all Unlocked — or, when ctx ends first, reports the ones still held
// (ErrStillHeld) and drops them as Close does. A nested acquisition of a
// scope still held re-enters meanwhile, so a request finishing its work is
// not failed by the shutdown.
func TestShutdown(t *testing.T) {
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	s := redistest.Start(t)
	rdb := s.Client()
	other := locks.New(s.Client())
	defer other.Close()

	t.Run("all released", func(t *testing.T) {
		c := locks.New(s.Client(), locks.Lease(lease))
		octx := locks.WithOwner(ctx, "request-1")
		lk, err := c.Lock(octx, "sd:1")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- c.Shutdown(ctx) }()
		eventually(t, 5*time.Second, "shutting down", func() bool {
			probe, err := c.TryLock(ctx, "sd:new")
			if err == nil {
				// Taken before Shutdown began: give it back, or Shutdown
				// would wait for it.
				_ = probe.Unlock(ctx)
			}
			return errors.Is(err, locks.ErrClosed)
		})
		inner, err := c.Lock(octx, "sd:1") // the request finishing its work
		if err != nil {
			t.Fatalf("nested acquisition during Shutdown: %v", err)
		}
		// Past several leases: still renewed, not dropped.
		select {
		case <-lk.Lost():
			t.Fatal("a lock in use was dropped during the grace period")
		case err := <-done:
			t.Fatalf("Shutdown returned %v with a lock held", err)
		case <-time.After(3 * lease):
		}
		inner.Unlock(ctx)
		if err := lk.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := waitErr(t, done, 5*time.Second, "Shutdown after the last Unlock"); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if rdb.Exists(ctx, "cg:lock:{sd:1}").Val() != 0 {
			t.Fatal("lock left in Redis")
		}
	})

	t.Run("deadline", func(t *testing.T) {
		c := locks.New(s.Client(), locks.Lease(lease))
		blocker, err := other.TryLock(ctx, "sd:blocked")
		if err != nil {
			t.Fatal(err)
		}
		defer blocker.Unlock(ctx)
		waiting := make(chan error, 1)
		go func() {
			_, err := c.Lock(ctx, "sd:blocked", locks.WaitBudget(20*time.Second))
			waiting <- err
		}()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return rdb.ZCard(ctx, "cg:q:{sd:blocked}").Val() == 1 })
		kept, err := c.TryLock(ctx, "sd:kept")
		if err != nil {
			t.Fatal(err)
		}
		sctx, cancel := context.WithTimeout(ctx, 2*lease)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.Shutdown(sctx) }()
		if err := waitErr(t, waiting, time.Second, "waiting Lock during Shutdown"); !errors.Is(err, locks.ErrClosed) {
			t.Fatalf("waiting Lock during Shutdown: %v, want ErrClosed", err)
		}
		if n := rdb.ZCard(ctx, "cg:q:{sd:blocked}").Val(); n != 0 {
			t.Fatalf("%d queue places left", n)
		}
		err = waitErr(t, done, 5*time.Second, "Shutdown at its deadline")
		if !errors.Is(err, locks.ErrStillHeld) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Shutdown: %v, want ErrStillHeld and the context's error", err)
		}
		within(t, kept.Lost(), time.Second, "the lock still held is dropped (Lost)")
		if rdb.Exists(ctx, "cg:lock:{sd:kept}").Val() != 1 {
			t.Fatal("the dropped lock's key is gone before its Unlock: the application may still be using it")
		}
		// The application is done with it: its key goes now, not a lease
		// later.
		if err := kept.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
			t.Fatalf("Unlock of the dropped lock: %v", err)
		}
		if rdb.Exists(ctx, "cg:lock:{sd:kept}").Val() != 0 {
			t.Fatal("the dropped lock's key outlived its Unlock")
		}
	})
}

// Redlock: Close ends a waiting Lock at once with ErrClosed, and Shutdown
// waits for the locks in use.
func TestRedlockCloseEndsWaiters(t *testing.T) {
	ctx := context.Background()
	set := newRedlockSet(t, 3, nil, locks.Lease(2*time.Second))
	for i := range set.servers {
		set.holdForeign(t, i, "rl:closing")
	}
	got := make(chan error, 1)
	go func() {
		_, err := set.r.Lock(ctx, "rl:closing", locks.WaitBudget(20*time.Second))
		got <- err
	}()
	eventually(t, 5*time.Second, "waiter refused once", func() bool {
		info, _ := set.servers[0].Info(ctx, "commandstats")
		_, ok := info["cmdstat_evalsha"]
		return ok
	})
	lk, err := set.r.TryLock(ctx, "rl:kept")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- set.r.Shutdown(sctx) }()
	if err := waitErr(t, got, time.Second, "waiting Lock during Shutdown"); !errors.Is(err, locks.ErrClosed) {
		t.Fatalf("waiting Lock: %v, want ErrClosed", err)
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned %v with a lock in use", err)
	default:
	}
	if err := lk.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := waitErr(t, done, 5*time.Second, "Shutdown"); err != nil {
		t.Fatal(err)
	}
}

// Redlock: a lock Close dropped while held keeps its key on the nodes until
// its Unlock (the application may still be using it), which then removes it
// from every node, not a lease later.
func TestRedlockUnlockAfterCloseReleases(t *testing.T) {
	ctx := context.Background()
	set := newRedlockSet(t, 3, nil, locks.Lease(time.Minute))
	lk, err := set.r.TryLock(ctx, "rl:dropped")
	if err != nil {
		t.Fatal(err)
	}
	set.r.Close()
	within(t, lk.Lost(), time.Second, "the lock held at Close is dropped (Lost)")
	onNodes := func() (n int) {
		for _, a := range set.admin {
			n += int(a.Exists(ctx, rlKey("rl:dropped")).Val())
		}
		return n
	}
	if n := onNodes(); n < 2 { // TryLock returns on a quorum: the third node's grant may come later
		t.Fatalf("%d of 3 nodes keep the dropped lock before its Unlock, want a quorum", n)
	}
	if err := lk.Unlock(ctx); !errors.Is(err, locks.ErrNotHeld) {
		t.Fatalf("Unlock of the dropped lock: %v, want ErrNotHeld", err)
	}
	if n := onNodes(); n != 0 {
		t.Fatalf("%d of 3 nodes keep the dropped lock after its Unlock", n)
	}
}

// A call made while Close waits for an acquisition in flight fails at once
// with ErrClosed; it used to queue behind Close's barrier (a writer waiting
// on the RWMutex that every acquisition holds for reading) and wait as long
// as the acquisition in flight did.
func TestCallDuringCloseFailsAtOnce(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	h := &keyGate{key: "cg:lock:{in-flight}", open: make(chan struct{}), entered: make(chan struct{}, 1)}
	gated := s.Client()
	gated.AddHook(h)
	c := locks.New(gated, locks.CommandTimeout(time.Minute)) // the gated attempt outlasts the test's bounds
	var once sync.Once
	open := func() { once.Do(func() { close(h.open) }) }
	t.Cleanup(func() { open(); c.Close() })

	inFlight := make(chan error, 1)
	go func() {
		lk, err := c.TryLock(ctx, "in-flight")
		if lk != nil {
			err = errors.Join(errors.New("got a lock"), err)
		}
		inFlight <- err
	}()
	select {
	case <-h.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("attempt not sent")
	}
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	eventually(t, 5*time.Second, "client closing", c.Closing)
	for _, call := range []func() error{
		func() error { _, err := c.TryLock(ctx, "other"); return err },
		func() error { _, err := c.Lock(ctx, "other"); return err },
	} {
		got := make(chan error, 1)
		go func() { got <- call() }()
		if err := waitErr(t, got, 5*time.Second, "a call made while Close waits"); !errors.Is(err, locks.ErrClosed) {
			t.Fatalf("a call made while Close waits: %v, want ErrClosed", err)
		}
	}
	open()
	waitErr(t, inFlight, 5*time.Second, "the attempt in flight")
	waitErr(t, closed, 5*time.Second, "Close")
}
