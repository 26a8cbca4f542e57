package cacheguard_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
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
