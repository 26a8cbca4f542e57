package fleet

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// LoadConfig shapes a steady workload.
type LoadConfig struct {
	Seed    uint64
	Writers int           // goroutines sending conflicting edits, one at a time each
	Readers int           // goroutines reading, alternating the Get and ginmw.Cache routes
	Repos   []uint        // the repositories edited and read
	Think   time.Duration // pause between a goroutine's requests (keeps the CPU for the services)
	// Mixed: each edit is drawn from the three kinds (a settings edit, a
	// rename, a read-then-Save: see Pause) instead of always a settings edit.
	Mixed bool
}

// Load is a running workload; Stop ends it.
type Load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	edits  atomic.Int64
	acked  atomic.Int64
	reads  atomic.Int64
	// crossBackwards counts a reader's answers older than its previous one
	// from another process: not guaranteed (see MATRIX.md), so a figure.
	crossBackwards atomic.Int64
}

// StartLoad starts a workload on the fleet; the caller must Stop it.
func (f *Fleet) StartLoad(ctx context.Context, cfg LoadConfig) *Load {
	// Requests run under ctx; stop only ends the loops, so that no request
	// is cut off by Stop (an edit cut off would have no answer).
	stop, cancel := context.WithCancel(ctx)
	l := &Load{cancel: cancel}
	n := len(f.procs)
	for w := range cfg.Writers {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(w)))
		l.wg.Go(func() {
			for stop.Err() == nil {
				r := editRequest{proc: rng.IntN(n), repo: cfg.Repos[rng.IntN(len(cfg.Repos))]}
				if cfg.Mixed {
					k := rng.IntN(3)
					r.rename, r.save = k == 1, k == 2
				}
				op := f.edit(ctx, r)
				l.edits.Add(1)
				if op.Status == 200 {
					l.acked.Add(1)
				}
				hold(stop, jitter(rng, cfg.Think))
			}
		})
	}
	for r := range cfg.Readers {
		rng := rand.New(rand.NewPCG(cfg.Seed, uint64(1000+r)))
		l.wg.Go(func() {
			last := map[[2]any]int{}
			for i := 0; stop.Err() == nil; i++ {
				route := RouteGet
				if i%2 == 1 {
					route = RouteList
				}
				repo := cfg.Repos[rng.IntN(len(cfg.Repos))]
				op := f.Read(ctx, rng.IntN(n), route, repo)
				l.reads.Add(1)
				if op.Status == 200 && op.Err == nil {
					k := [2]any{route, repo}
					if op.Version < last[k] {
						l.crossBackwards.Add(1)
					}
					last[k] = max(last[k], op.Version)
				}
				hold(stop, jitter(rng, cfg.Think))
			}
		})
	}
	return l
}

// Stop ends the workload and waits for its goroutines, which finish the
// requests they have in flight.
func (l *Load) Stop() {
	l.cancel()
	l.wg.Wait()
}

// jitter returns d ± 50%.
func jitter(rng *rand.Rand, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d/2 + time.Duration(rng.Int64N(int64(d)))
}
