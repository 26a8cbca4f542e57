package cacheguard_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheguard/cacheguard/cacheguard"
)

// TestHotKeyNeverWaitsForItsReload (issue 48): on default settings, a key
// read without pause by two processes is refreshed before it expires, or,
// when its refresh is late, served stale for at most a quarter TTL while the
// refresh runs — no read after the first waits for a load (Miss or
// Coalesced), and loads stay about one per TTL. Every other load is slower
// than the early-refresh window, so both paths run.
func TestHotKeyNeverWaitsForItsReload(t *testing.T) {
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	key := testKey(t)
	var loads, slow atomic.Int64
	load := func(ctx context.Context) (item, error) {
		n := loads.Add(1)
		d := 60 * time.Millisecond
		if n%2 == 0 {
			d = 200 * time.Millisecond // slower than the window (a quarter TTL: 150ms)
			slow.Add(1)
		}
		select {
		case <-time.After(d): // the database's work
		case <-ctx.Done():
			return item{}, ctx.Err()
		}
		return item{ID: int(n)}, nil
	}
	g1, _ := newGuard(t, cacheguard.TTL(ttl))
	g2, _ := newGuard(t, cacheguard.TTL(ttl))
	if _, err := cacheguard.Get(ctx, g1, key, load); err != nil {
		t.Fatal(err)
	}
	const run = 3 * time.Second // five TTLs
	var mu sync.Mutex
	results := map[cacheguard.Result]int{}
	var errs []error
	var wg sync.WaitGroup
	start := time.Now()
	for _, g := range []*cacheguard.Guard{g1, g2, g1, g2} {
		wg.Go(func() {
			tick := time.NewTicker(2 * time.Millisecond) // a steady reader
			defer tick.Stop()
			for time.Since(start) < run {
				var res cacheguard.Result
				_, err := cacheguard.Get(ctx, g, key, load, cacheguard.ReportTo(&res))
				mu.Lock()
				results[res]++
				if err != nil {
					errs = append(errs, err)
				}
				mu.Unlock()
				<-tick.C
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d reads failed, the first: %v", len(errs), errs[0])
	}
	t.Logf("reads by result: %v; loads %d (%d slow) in %v", results, loads.Load(), slow.Load(), run)
	if n := results[cacheguard.Miss] + results[cacheguard.Coalesced]; n > 0 {
		t.Fatalf("%d of the reads waited for a load (%v): a hot key expired under its readers", n, results)
	}
	if slow.Load() == 0 || results[cacheguard.Stale] == 0 {
		t.Logf("no late refresh was served stale this run (slow loads %d)", slow.Load())
	}
	// One load per TTL − 2Δ at most, plus the first: about 6 here; 10 is a
	// refresh per half TTL, twice what the ideal needs.
	if n := loads.Load(); n > 1+int64(run/(ttl/2)) {
		t.Fatalf("%d loads in %v with a %v TTL: more than one per half TTL", n, run, ttl)
	}
}
