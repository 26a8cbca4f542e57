package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// prepare makes job j's worker; db is the loader of a job on the real
// database (nil for the others).
func prepare(ctx context.Context, j Job, db *pgdb.Loader) (worker, error) {
	if len(j.Addrs) == 0 {
		return nil, fmt.Errorf("job %s: no Redis address", j.Kind)
	}
	switch j.Kind {
	case "pgstampede", "pgmix":
		return preparePG(ctx, j, db)
	case "nearwatch", "nearwrite":
		return prepareNear(ctx, j)
	}
	cnt := &systems.Counter{}
	switch j.Kind {
	case "cycle", "contended":
		m, err := systems.NewMutex(j.System, systems.MutexConfig{Addrs: j.Addrs, Retry: j.Retry, Counter: cnt})
		if err != nil {
			return nil, err
		}
		// Warm up: connections dialled, scripts loaded, outside the measurement.
		for i := range 2 * j.Goroutines {
			h, err := m.Acquire(ctx, j.Key+":warm:"+strconv.Itoa(i%j.Goroutines))
			if err != nil {
				m.Close()
				return nil, fmt.Errorf("warm-up: %w", err)
			}
			h.Release(ctx)
		}
		if j.Kind == "cycle" {
			w := &cycleWorker{j: j, m: m, cnt: cnt}
			if j.Keys > j.Goroutines {
				// Many names: every one is used once before the run, so
				// that the run measures hot names.
				var wg sync.WaitGroup
				var e errs
				for g := range j.Goroutines {
					wg.Go(func() {
						for _, name := range w.names(g) {
							h, err := m.Acquire(ctx, name)
							if err != nil {
								e.add(err)
								return
							}
							h.Release(ctx)
						}
					})
				}
				wg.Wait()
				if e.n.Load() > 0 {
					m.Close()
					return nil, fmt.Errorf("warm-up: %s", e.first)
				}
			}
			return w, nil
		}
		return &contendedWorker{j: j, m: m, cnt: cnt}, nil
	case "stampede", "warm", "mix":
		fm, err := newFillMarks(ctx, j)
		if err != nil {
			return nil, err
		}
		c, err := systems.NewCache(j.System, systems.CacheConfig{Addr: j.Addrs[0], TTL: j.TTL, Retry: j.Retry, Counter: cnt, Marks: fm.cacheMarks()})
		if err != nil {
			fm.Close()
			return nil, err
		}
		w := &cacheWorker{j: j, c: c, cnt: cnt, fm: fm}
		quick := func(context.Context) (systems.Repo, error) { return systems.SampleRepo(0), nil }
		var warm []string
		switch j.Kind {
		case "warm":
			for i := range max(j.Keys, 1) {
				warm = append(warm, j.Key+":"+strconv.Itoa(i))
			}
		default:
			for i := range 4 {
				warm = append(warm, j.Key+":warm:"+strconv.Itoa(i))
			}
		}
		// Fill them with as many goroutines as the run has (one after
		// another, the warm scenario's 1000 keys took 0.3-0.8 s a run).
		var wg sync.WaitGroup
		var e errs
		for g := range min(max(j.Goroutines, 1), len(warm)) {
			wg.Go(func() {
				for i := g; i < len(warm); i += max(j.Goroutines, 1) {
					if _, err := c.Get(ctx, warm[i], quick); err != nil {
						e.add(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if e.n.Load() > 0 {
			w.Close()
			return nil, fmt.Errorf("warm-up: %s", e.first)
		}
		// Then as many concurrent hits as the run has goroutines, so that
		// connection pools are as warm as a busy service's: the run measures
		// the system, not the dialling of new connections.
		for g := range j.Goroutines {
			wg.Go(func() {
				if _, err := c.Get(ctx, warm[g%len(warm)], quick); err != nil {
					e.add(err)
				}
			})
		}
		wg.Wait()
		if e.n.Load() > 0 {
			w.Close()
			return nil, fmt.Errorf("warm-up: %s", e.first)
		}
		return w, nil
	}
	return nil, fmt.Errorf("unknown job kind %q", j.Kind)
}

// errs counts errors and keeps the first.
type errs struct {
	n     atomic.Int64
	once  sync.Once
	first string
}

func (e *errs) add(err error) {
	e.n.Add(1)
	e.once.Do(func() { e.first = err.Error() })
}

// --- uncontended lock cycles: every goroutine locks and unlocks its own name

type cycleWorker struct {
	j   Job
	m   systems.Mutex
	cnt *systems.Counter
}

func (w *cycleWorker) Close() { w.m.Close() }

// names returns the names goroutine g cycles over: its own one, or with
// Keys names in all, every Goroutines-th of them from g.
func (w *cycleWorker) names(g int) []string {
	var out []string
	for n := g; n < max(w.j.Keys, w.j.Goroutines); n += w.j.Goroutines {
		out = append(out, w.j.Key+":"+strconv.Itoa(n))
	}
	return out
}

func (w *cycleWorker) Run(ctx context.Context) Report {
	var e errs
	if w.j.Wakes {
		return traced(w.j.Goroutines, &e, func() [][]int64 { return w.cycles(ctx, w.j.Duration, &e) })
	}
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	req0 := w.cnt.Load()
	os0 := readOS()
	start := time.Now()
	lats := w.cycles(ctx, w.j.Duration, &e)
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	r := Report{Requests: w.cnt.Load() - req0, Mallocs: ms1.Mallocs - ms0.Mallocs, Errors: e.n.Load(), FirstErr: e.first, Elapsed: int64(elapsed)}
	os0.since(&r)
	r.Ops, r.Dist = distOf(lats)
	return r
}

// cycles runs lock cycles for d on every goroutine of the job and returns
// each goroutine's latencies.
func (w *cycleWorker) cycles(ctx context.Context, d time.Duration, e *errs) [][]int64 {
	lats := make([][]int64, w.j.Goroutines)
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for g := range w.j.Goroutines {
		names := w.names(g)
		wg.Go(func() {
			lat := make([]int64, 0, 4096)
			for i := 0; time.Now().Before(end); i++ {
				name := names[i%len(names)]
				t0 := time.Now()
				rctx, cancel := ctx, context.CancelFunc(nil)
				if w.j.Request {
					rctx, cancel = context.WithCancel(ctx)
				}
				h, err := w.m.Acquire(rctx, name)
				if err == nil {
					err = h.Release(rctx)
				}
				if cancel != nil {
					cancel()
				}
				if err != nil {
					e.add(err)
					continue
				}
				lat = append(lat, int64(time.Since(t0)))
			}
			lats[g] = lat
		})
	}
	wg.Wait()
	return lats
}

// traced is a Job.Wakes run: run (a worker's loop on g goroutines) under
// the execution tracer, reporting who woke its goroutines, the loop's own
// hand-offs (starting its g goroutines, and the last one's end waking the
// waiter) taken out.
func traced(g int, e *errs, run func() [][]int64) Report {
	wk, err := traceWakes(func() int64 {
		n, _ := distOf(run())
		return n
	})
	var r Report
	if err != nil {
		e.add(fmt.Errorf("wake-up trace: %w", err))
	} else {
		r.Ops, r.Wakes = wk.ops, &WakeCounts{Ops: wk.ops, ByRuntime: wk.byRuntime, HandOffs: max(wk.handOffs-int64(g)-1, 0)}
	}
	r.Errors, r.FirstErr = e.n.Load(), e.first
	return r
}

// distOf returns how many latencies lats holds and their distribution.
func distOf(lats [][]int64) (int64, *stats.Dist) {
	n := 0
	for _, l := range lats {
		n += len(l)
	}
	all := make([]time.Duration, 0, n)
	for _, l := range lats {
		for _, v := range l {
			all = append(all, time.Duration(v))
		}
	}
	d := stats.SortDurations(all) // a near cache's run has millions: no second copy
	return int64(n), &d
}

// --- one contended lock: every goroutine of every process takes the same name

type contendedWorker struct {
	j   Job
	m   systems.Mutex
	cnt *systems.Counter
}

func (w *contendedWorker) Close() { w.m.Close() }

func (w *contendedWorker) Run(ctx context.Context) Report {
	var e errs
	acqs := make([][]Acq, w.j.Goroutines)
	req0 := w.cnt.Load()
	start := time.Now()
	end := start.Add(w.j.Duration)
	var wg sync.WaitGroup
	for g := range w.j.Goroutines {
		wg.Go(func() {
			var mine []Acq
			for time.Now().Before(end) {
				t0 := time.Now()
				// actx stays alive while the lock is held: rueidislock's lock
				// ends with the context it was taken with.
				actx, cancel := context.WithTimeout(ctx, 30*time.Second)
				if w.j.Cutoff {
					actx, cancel = context.WithDeadline(ctx, end)
				}
				h, err := w.m.Acquire(actx, w.j.Key)
				if err != nil {
					cancel()
					if !w.j.Cutoff || actx.Err() == nil {
						e.add(err)
					}
					continue
				}
				grant := time.Now()
				time.Sleep(w.j.Hold)
				rel := time.Now()
				if err := h.Release(ctx); err != nil {
					e.add(err)
				}
				cancel()
				mine = append(mine, Acq{Wait: int64(grant.Sub(t0)), Grant: grant.UnixNano(), Release: rel.UnixNano()})
			}
			acqs[g] = mine
		})
	}
	wg.Wait()
	r := Report{Requests: w.cnt.Load() - req0, Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(), Elapsed: int64(time.Since(start))}
	for _, a := range acqs {
		r.Ops += int64(len(a))
		r.Acqs = append(r.Acqs, a...)
	}
	return r
}

// --- cache reads: a stampede burst, warm hits, or a paced hot-key mix

type cacheWorker struct {
	j   Job
	c   systems.Cache
	cnt *systems.Counter
	fm  *fillMarks // a stampede's timeline (nil without Timeline)
}

func (w *cacheWorker) Close() {
	w.c.Close()
	w.fm.Close()
}

// db is the database: every load takes j.Load and is counted.
type db struct {
	d     time.Duration
	loads atomic.Int64
	mu    sync.Mutex // guards at and spans
	at    []int64
	stamp bool       // record at
	spans [][2]int64 // each load's start and end (unix ns), when stamp
}

func (d *db) load(ctx context.Context) (systems.Repo, error) {
	d.loads.Add(1)
	start := time.Now()
	if d.stamp {
		d.mu.Lock()
		d.at = append(d.at, start.UnixNano())
		d.mu.Unlock()
	}
	t := time.NewTimer(d.d)
	defer t.Stop()
	select {
	case <-t.C:
		if d.stamp {
			end := time.Now().UnixNano()
			d.mu.Lock()
			d.spans = append(d.spans, [2]int64{start.UnixNano(), end})
			d.mu.Unlock()
		}
		return systems.SampleRepo(42), nil
	case <-ctx.Done():
		return systems.Repo{}, ctx.Err()
	}
}

func (w *cacheWorker) Run(ctx context.Context) Report {
	switch w.j.Kind {
	case "stampede":
		return w.burst(ctx)
	case "warm":
		return w.warm(ctx)
	default:
		return w.mix(ctx)
	}
}

// burst: every goroutine asks for the same key at once.
func (w *cacheWorker) burst(ctx context.Context) Report {
	d := &db{d: w.j.Load, stamp: w.fm != nil}
	var e errs
	lat := make([]int64, w.j.Goroutines)
	t0s := make([]int64, w.j.Goroutines)
	w.fm.reset()
	req0 := w.cnt.Load()
	os0 := readOS()
	start := time.Now()
	var wg sync.WaitGroup
	for g := range w.j.Goroutines {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			t0 := time.Now()
			v, err := w.c.Get(rctx, w.j.Key, d.load)
			lat[g] = int64(time.Since(t0))
			t0s[g] = t0.UnixNano()
			if err == nil && v.ID == 0 {
				err = fmt.Errorf("got an empty value")
			}
			if err != nil {
				e.add(err)
			}
		})
	}
	wg.Wait()
	if w.j.Settle > 0 {
		time.Sleep(w.j.Settle)
	}
	d.mu.Lock()
	spans := slices.Clone(d.spans)
	d.mu.Unlock()
	r := Report{Ops: int64(w.j.Goroutines), Lat: lat, Loads: d.loads.Load(), Requests: w.cnt.Load() - req0,
		Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(), Elapsed: int64(time.Since(start)),
		Fill: w.fm.fill(spans, t0s, lat)}
	os0.since(&r)
	return r
}

// warm: hits on keys filled during preparation, as fast as they go.
func (w *cacheWorker) warm(ctx context.Context) Report {
	d := &db{d: w.j.Load}
	var e errs
	keys := make([]string, max(w.j.Keys, 1))
	for i := range keys {
		keys[i] = w.j.Key + ":" + strconv.Itoa(i)
	}
	if w.j.Wakes {
		return traced(w.j.Goroutines, &e, func() [][]int64 { return w.hits(ctx, keys, d, w.j.Duration, &e) })
	}
	var ms0, ms1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms0)
	req0 := w.cnt.Load()
	os0 := readOS()
	start := time.Now()
	lats := w.hits(ctx, keys, d, w.j.Duration, &e)
	elapsed := time.Since(start)
	runtime.ReadMemStats(&ms1)
	r := Report{Loads: d.loads.Load(), Requests: w.cnt.Load() - req0, Mallocs: ms1.Mallocs - ms0.Mallocs,
		Errors: e.n.Load(), FirstErr: e.first, Elapsed: int64(elapsed)}
	os0.since(&r)
	r.Ops, r.Dist = distOf(lats)
	return r
}

// hits reads keys round-robin for d on every goroutine of the job and
// returns each goroutine's latencies.
func (w *cacheWorker) hits(ctx context.Context, keys []string, d *db, dur time.Duration, e *errs) [][]int64 {
	lats := make([][]int64, w.j.Goroutines)
	end := time.Now().Add(dur)
	var wg sync.WaitGroup
	load := d.load // one method value: a closure per call would be the harness's allocation, not the system's
	for g := range w.j.Goroutines {
		wg.Go(func() {
			lat := make([]int64, 0, 8192)
			for i := g; time.Now().Before(end); i++ {
				t0 := time.Now()
				if _, err := w.c.Get(ctx, keys[i%len(keys)], load); err != nil {
					e.add(err)
				}
				lat = append(lat, int64(time.Since(t0)))
			}
			lats[g] = lat
		})
	}
	wg.Wait()
	return lats
}

// mix: paced requests over a Zipf-distributed key space whose entries expire.
func (w *cacheWorker) mix(ctx context.Context) Report {
	d := &db{d: w.j.Load, stamp: true}
	var e errs
	lats := make([][]int64, w.j.Goroutines)
	keys := make([][]int32, w.j.Goroutines) // every request's key and send time, for the ideal
	sent := make([][]int64, w.j.Goroutines)
	req0 := w.cnt.Load()
	start := time.Now()
	end := start.Add(w.j.Duration)
	steady := start.Add(w.j.Warmup)
	var wg sync.WaitGroup
	for g := range w.j.Goroutines {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(w.j.Seed, uint64(g)))
			zipf := rand.NewZipf(rng, 1.1, 1, uint64(max(w.j.Keys, 2)-1))
			// Spread the goroutines' first requests over one interval.
			next := start.Add(time.Duration(rng.Int64N(int64(w.j.Interval) + 1)))
			var lat []int64
			for next.Before(end) {
				time.Sleep(time.Until(next))
				z := zipf.Uint64()
				k := w.j.Key + ":" + strconv.FormatUint(z, 10)
				t0 := time.Now()
				keys[g] = append(keys[g], int32(z))
				sent[g] = append(sent[g], t0.UnixNano())
				rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := w.c.Get(rctx, k, d.load)
				cancel()
				if t0.After(steady) {
					lat = append(lat, int64(time.Since(t0)))
				}
				if err != nil {
					e.add(err)
				}
				next = next.Add(w.j.Interval)
			}
			lats[g] = lat
		})
	}
	wg.Wait()
	// Background refreshes may still be loading: copy under the lock.
	d.mu.Lock()
	at := slices.Clone(d.at)
	d.mu.Unlock()
	r := Report{Loads: d.loads.Load(), LoadAt: at, Requests: w.cnt.Load() - req0,
		Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(), Elapsed: int64(time.Since(start))}
	for g, l := range lats {
		r.Ops += int64(len(l))
		r.Lat = append(r.Lat, l...)
		r.ReqKey = append(r.ReqKey, keys[g]...)
		r.ReqAt = append(r.ReqAt, sent[g]...)
	}
	return r
}
