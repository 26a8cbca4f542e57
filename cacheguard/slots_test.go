package cacheguard_test

import (
	"context"
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
