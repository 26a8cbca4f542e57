package cacheguard_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/cacheguard"
	"github.com/cacheguard/cacheguard/internal/redistest"
)

// MaxConcurrentLoads bounds every load a Guard runs, leased ones too: while
// one load holds the only slot, no other loader runs; the slot then goes to
// the load a caller waits for (a miss) before the refresh queued earlier in
// the background (a stale value was served); a Get a loader makes under its
// load's context takes no slot (it would wait for its caller's).
func TestMaxConcurrentLoadsOrder(t *testing.T) {
	ctx := context.Background()
	const ttl = 300 * time.Millisecond
	g, _ := newGuard(t, cacheguard.MaxConcurrentLoads(1), cacheguard.TTL(ttl), cacheguard.Jitter(0),
		cacheguard.ServeStale(time.Minute), cacheguard.EarlyRefresh(0))
	kA, kB, kC, kN := testKey(t, "a"), testKey(t, "b"), testKey(t, "c"), testKey(t, "nested")

	var mu sync.Mutex
	var order []string
	running, most := 0, 0
	loader := func(name string, hold <-chan struct{}) func(context.Context) (item, error) {
		return func(ctx context.Context) (item, error) {
			mu.Lock()
			order = append(order, name)
			running++
			most = max(most, running)
			mu.Unlock()
			defer func() {
				mu.Lock()
				running--
				mu.Unlock()
			}()
			if hold != nil {
				select {
				case <-hold:
				case <-ctx.Done():
					return item{}, ctx.Err()
				}
			}
			return item{Name: name}, nil
		}
	}

	holdA := make(chan struct{})
	nested := func(ctx context.Context) (item, error) {
		v, err := loader("A", holdA)(ctx)
		if err != nil {
			return v, err
		}
		// Under its load's context: no slot of its own to wait for.
		_, err = cacheguard.Get(ctx, g, kN, loader("N", nil))
		return v, err
	}
	seen := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), order...)
	}

	// B holds a value that is past its TTL once A holds the only slot.
	if _, err := cacheguard.Get(ctx, g, kB, loader("B0", nil)); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	order = nil
	mu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	errs := make(chan error, 2)
	wg.Go(func() {
		_, err := cacheguard.Get(ctx, g, kA, nested)
		errs <- err
	})
	eventually(t, 5*time.Second, "A's load runs", func() bool { return len(seen()) == 1 })
	// The first Get that finds B stale queues its refresh in the background.
	eventually(t, 5*time.Second, "B served stale", func() bool {
		var res cacheguard.Result
		_, err := cacheguard.Get(ctx, g, kB, loader("B1", nil), cacheguard.ReportTo(&res))
		return err == nil && res == cacheguard.Stale
	})
	eventually(t, 5*time.Second, "B's refresh waits for a slot", func() bool { return cacheguard.LoadsWaiting(g) == 1 })
	// Then a miss, whose caller waits.
	wg.Go(func() {
		_, err := cacheguard.Get(ctx, g, kC, loader("C", nil))
		errs <- err
	})
	eventually(t, 5*time.Second, "C's load waits for a slot", func() bool { return cacheguard.LoadsWaiting(g) == 2 })
	if got := seen(); len(got) != 1 {
		t.Fatalf("while A holds the only slot, loads ran: %v", got)
	}
	close(holdA)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 5*time.Second, "B's refresh runs", func() bool { return len(seen()) == 4 })
	if got, want := seen(), []string{"A", "N", "C", "B1"}; !slices.Equal(got, want) {
		t.Errorf("loads ran in the order %v, want %v (the nested Get at once, the miss before the refresh)", got, want)
	}
	mu.Lock()
	defer mu.Unlock()
	if most > 2 {
		t.Errorf("%d loads ran at once, want at most A and the Get its loader made", most)
	}
}

// A Get a loader makes under its load's context is served by a flight of
// the same entry that another caller started and that waits for a slot —
// the slot that loader holds: that flight runs at once, as the nested Get
// would have, instead of keeping the loader (and the slot) waiting until
// the nested Get's budget ends. The same when the nested Get shares a read
// that another caller of the entry started.
func TestMaxConcurrentLoadsNestedJoin(t *testing.T) {
	ctx := context.Background()
	g, _ := newGuard(t, cacheguard.MaxConcurrentLoads(1), cacheguard.WaitBudget(time.Minute),
		cacheguard.LoadTimeout(time.Minute))
	kA, kB := testKey(t, "a"), testKey(t, "b")
	var loadsB sync.WaitGroup
	var nB int
	var mu sync.Mutex
	loadB := func(context.Context) (item, error) {
		mu.Lock()
		nB++
		mu.Unlock()
		return item{Name: "B"}, nil
	}
	started, release := make(chan struct{}), make(chan struct{})
	nestedDone := make(chan error, 1)
	loadA := func(ctx context.Context) (item, error) {
		close(started)
		<-release
		v, err := cacheguard.Get(ctx, g, kB, loadB)
		if err == nil && v.Name != "B" {
			err = errors.New("nested Get of B served " + v.Name)
		}
		nestedDone <- err
		return item{Name: "A"}, err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	wg.Go(func() {
		if _, err := cacheguard.Get(ctx, g, kA, loadA); err != nil {
			t.Errorf("Get of A: %v", err)
		}
	})
	<-started
	// B's miss, from outside any load: its flight waits for the slot A holds.
	loadsB.Add(1)
	wg.Go(func() {
		defer loadsB.Done()
		if _, err := cacheguard.Get(ctx, g, kB, loadB); err != nil {
			t.Errorf("Get of B: %v", err)
		}
	})
	eventually(t, 5*time.Second, "B's flight waits for a slot", func() bool { return cacheguard.LoadsWaiting(g) == 1 })
	close(release)
	select {
	case err := <-nestedDone:
		if err != nil {
			t.Fatalf("nested Get of B: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the nested Get of B still waits for B's flight, which waits for the slot its own caller holds")
	}
	loadsB.Wait()
	mu.Lock()
	defer mu.Unlock()
	if nB != 1 {
		t.Errorf("B loaded %d times, want 1 (the nested Get shares the waiting flight)", nB)
	}
}

// The same when the loader's Get would share a read of the entry that
// another caller sent first: that read's callers are handed, on a miss, to
// the fill it starts, which waits for the slot the loader holds. The
// loader's Get reads on its own instead, and loads (taking no slot).
func TestMaxConcurrentLoadsNestedSharesNoRead(t *testing.T) {
	ctx := context.Background()
	s := redistest.Start(t)
	rdb := s.Client(func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	kA, kB := testKey(t, "a"), testKey(t, "b")
	// As many reads of B as a Guard sends at once for one entry (the others
	// queue behind them: see Guard.readOne), held on their way to Redis.
	hold := &holdRead{key: kB, n: max(2, runtime.GOMAXPROCS(0)), held: make(chan struct{}), release: make(chan struct{})}
	rdb.AddHook(hold)
	g := cacheguard.New(rdb, cacheguard.MaxConcurrentLoads(1), cacheguard.WaitBudget(time.Minute),
		cacheguard.LoadTimeout(time.Minute), cacheguard.CommandTimeout(time.Minute))
	defer g.Close()
	defer hold.free()
	release := make(chan struct{})
	nested := make(chan error, 1)
	loadA := func(ctx context.Context) (item, error) {
		<-release
		_, err := cacheguard.Get(ctx, g, kB, (&counter{name: "nested"}).load)
		nested <- err
		return item{Name: "A"}, err
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		if _, err := cacheguard.Get(ctx, g, kA, loadA); err != nil {
			t.Errorf("Get of A: %v", err)
		}
	})
	// B's reads, from outside any load.
	for range hold.n {
		wg.Go(func() {
			if _, err := cacheguard.Get(ctx, g, kB, (&counter{name: "outside"}).load); err != nil {
				t.Errorf("Get of B: %v", err)
			}
		})
	}
	select {
	case <-hold.held:
	case <-time.After(10 * time.Second):
		t.Fatal("B's reads never reached the hook")
	}
	close(release)
	// The loader's Get either finishes (reading on its own) or queues behind
	// B's reads; then they go on, find B absent, and their fill waits for the
	// slot A holds.
	eventually(t, 10*time.Second, "the loader's Get returned or queued behind B's read", func() bool {
		return len(nested) == 1 || cacheguard.ReadsQueued(g) == 1
	})
	hold.free()
	select {
	case err := <-nested:
		if err != nil {
			t.Fatalf("nested Get of B: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the nested Get of B still waits for a read handed to a fill that waits for the slot its own caller holds")
	}
}

// holdRead holds the first n HGETs of key's values on its way to Redis
// until free is called (held closes when n are held).
type holdRead struct {
	key           string
	n             int
	mu            sync.Mutex
	seen          int
	freed         sync.Once
	held, release chan struct{}
}

func (h *holdRead) free() { h.freed.Do(func() { close(h.release) }) }

func (h *holdRead) wait(ctx context.Context, cmds []redis.Cmder) {
	for _, cmd := range cmds {
		args := cmd.Args()
		if len(args) < 2 || cmd.Name() != "hget" {
			continue
		}
		name := fmt.Sprint(args[1])
		if p, ok := args[1].(*string); ok { // a hit's command line (see hget)
			name = *p
		}
		if strings.Contains(name, h.key) {
			h.mu.Lock()
			h.seen++
			mine := h.seen <= h.n
			if h.seen == h.n {
				close(h.held)
			}
			h.mu.Unlock()
			if mine {
				select {
				case <-h.release:
				case <-ctx.Done():
				}
			}
			return
		}
	}
}

func (h *holdRead) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *holdRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.wait(ctx, []redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}
func (h *holdRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.wait(ctx, cmds)
		return next(ctx, cmds)
	}
}

// TestUnfitFlightWaitingForSlotDoesNotLoad: a fill that turned unfit (its key
// invalidated) while it waited for a load slot has no callers left and a
// store bound to fail: it does not run its loader when it gets the slot; the
// call loads once, in the flight it joined after the Invalidate.
func TestUnfitFlightWaitingForSlotDoesNotLoad(t *testing.T) {
	g, _ := newGuard(t, cacheguard.MaxConcurrentLoads(1))
	queuedFillInvalidated(t, g, g, 0, func() {
		eventually(t, 10*time.Second, "the call's new fill waiting too", func() bool { return cacheguard.LoadsWaiting(g) == 2 })
	})
}

// TestFillWaitingForSlotInvalidatedElsewhereDoesNotLoad: as
// TestUnfitFlightWaitingForSlotDoesNotLoad, with the key invalidated by
// another process: nothing here marks the flight unfit, and its lease's
// renewal (a third of the lease, 100 ms here) finds it void only after the
// load began, and the call then loads again while that load (slow: 500 ms)
// runs on. The fill confirms its lease once the slot is its own, and loads
// nothing; the call loads once, in the flight it joins after.
// (TestGenCache, 12-07: two loads of one key overlapped, the first on a
// lease voided while its fill queued.)
func TestFillWaitingForSlotInvalidatedElsewhereDoesNotLoad(t *testing.T) {
	g, rdb := newGuard(t, cacheguard.MaxConcurrentLoads(1), cacheguard.Lease(300*time.Millisecond))
	other := cacheguard.New(rdb)
	t.Cleanup(func() { other.Close() })
	queuedFillInvalidated(t, g, other, 500*time.Millisecond, func() {})
}

// queuedFillInvalidated holds g's only load slot (MaxConcurrentLoads(1))
// with a load of another key, queues a miss's fill of a key behind it, has
// by invalidate that key, calls then, frees the slot, and checks that the
// key was loaded once and its caller served that load. The first load of
// the key, if any, takes first (a slow one, past a renewal).
func queuedFillInvalidated(t *testing.T, g, by *cacheguard.Guard, first time.Duration, then func()) {
	t.Helper()
	ctx := context.Background()
	busy, key := testKey(t, "busy"), testKey(t, "k")
	hold := newGated("busy")
	t.Cleanup(func() {
		select {
		case <-hold.release:
		default:
			close(hold.release)
		}
	})
	busyDone := make(chan error, 1)
	go func() {
		_, err := cacheguard.Get(ctx, g, busy, hold.load)
		busyDone <- err
	}()
	<-hold.entered // it holds the only slot
	var loads atomic.Int64
	got := make(chan error, 1)
	go func() {
		v, err := cacheguard.Get(ctx, g, key, func(context.Context) (item, error) {
			n := loads.Add(1)
			if n == 1 {
				time.Sleep(first) // a slow load: what the test is about, not a synchronisation
			}
			return item{ID: int(n)}, nil
		})
		if err == nil && v.ID != 1 {
			err = fmt.Errorf("got load %d", v.ID)
		}
		got <- err
	}()
	eventually(t, 10*time.Second, "the fill waiting for the slot", func() bool { return cacheguard.LoadsWaiting(g) == 1 })
	if err := by.Invalidate(ctx, key); err != nil {
		t.Fatal(err)
	}
	then()
	close(hold.release)
	if err := <-busyDone; err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if n := loads.Load(); n != 1 {
		t.Errorf("the key was loaded %d times, want once: the fill invalidated while it queued loaded too", n)
	}
}
