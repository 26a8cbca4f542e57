package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
	"github.com/cacheguard/cacheguard/cacheguard"
)

// pgWorker drives one cache system whose loader queries the real database.
type pgWorker struct {
	j   Job
	c   systems.Cache
	db  *pgdb.Loader
	cnt *systems.Counter
	fm  *fillMarks // a stampede's timeline (nil without Timeline)
	tr  *systems.Trace
	all *pushLog // every message of the run (with Trace)
}

func preparePG(ctx context.Context, j Job, db *pgdb.Loader) (worker, error) {
	if db == nil || j.Deadline <= 0 {
		return nil, fmt.Errorf("job %s: needs a DSN, a pool size and a deadline", j.Kind)
	}
	cnt := &systems.Counter{}
	fm, err := newFillMarks(ctx, j)
	if err != nil {
		return nil, err
	}
	var tr *systems.Trace
	var all *pushLog
	if j.Trace {
		tr = &systems.Trace{}
		if all, err = logPushes(ctx, j.Addrs[0]); err != nil {
			fm.Close()
			return nil, err
		}
	}
	c, err := systems.NewCache(j.System, systems.CacheConfig{Addr: j.Addrs[0], TTL: j.TTL, Counter: cnt, Marks: fm.cacheMarks(), Trace: tr})
	if err != nil {
		fm.Close()
		all.Close()
		return nil, err
	}
	// Warm the cache's connections as in prepare: as many concurrent hits
	// as the process will have requests in flight, on keys of their own.
	quick := func(context.Context) (systems.Repo, error) { return systems.SampleRepo(0), nil }
	var wg sync.WaitGroup
	var e errs
	for g := range max(j.Goroutines, 16) {
		wg.Go(func() {
			if _, err := c.Get(ctx, j.Key+":warm:"+strconv.Itoa(g%4), quick); err != nil {
				e.add(err)
			}
		})
	}
	wg.Wait()
	w := &pgWorker{j: j, c: c, db: db, cnt: cnt, fm: fm, tr: tr, all: all}
	if e.n.Load() > 0 {
		w.Close()
		return nil, fmt.Errorf("warm-up: %s", e.first)
	}
	return w, nil
}

func (w *pgWorker) Close() {
	w.c.Close()
	w.fm.Close()
	w.all.Close()
}

// load returns the loader of repo id: one query on the database. The value
// carries when its query returned (UpdatedAt, unix ns), so that a request can
// tell how old the value it was served is.
func (w *pgWorker) load(id int64) systems.Loader {
	return func(ctx context.Context) (systems.Repo, error) {
		r, err := w.db.Load(ctx, id)
		if err != nil {
			return systems.Repo{}, err
		}
		v := systems.SampleRepo(id)
		v.Stars, v.Forks, v.UpdatedAt = int(r.Stars), int(r.Events), time.Now().UnixNano()
		return v, nil
	}
}

// outcome classifies a request's error.
func outcome(err error) uint8 {
	switch {
	case err == nil:
		return outOK
	case errors.Is(err, pgdb.ErrPool):
		return outPool
	case errors.Is(err, pgdb.ErrQuery):
		return outQuery
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, cacheguard.ErrWaitTimeout):
		return outTimeout
	}
	return outOther
}

func (w *pgWorker) Run(ctx context.Context) Report {
	if w.j.Kind == "pgstampede" {
		return w.burst(ctx)
	}
	return w.mix(ctx)
}

// report completes r with the loader's counts; t0s are a stampede's request
// starts (unix ns), for its timeline.
func (w *pgWorker) report(r Report, t0s []int64) Report {
	w.db.Seal()
	st := w.db.Stats()
	r.Loads, r.LoadAt = st.Sent, st.At
	if w.j.Kind == "pgmix" {
		r.PG.Spans = st.Spans
	}
	if w.tr != nil {
		r.Trace = append(w.tr.Events(), w.all.events()...)
	}
	if w.fm != nil {
		loads := make([][2]int64, 0, len(st.Spans))
		for _, sp := range st.Spans {
			loads = append(loads, [2]int64{sp.Start, sp.End})
		}
		r.Fill = w.fm.fill(loads, t0s, r.PG.LatAll)
	}
	r.PG.Sent, r.PG.OK, r.PG.PoolFails, r.PG.QueryErrs = st.Sent, st.OK, st.PoolFails, st.QueryErrs
	r.Requests = w.cnt.Load()
	return r
}

// burst: every goroutine asks for the same cold key at once, each with the
// request deadline.
func (w *pgWorker) burst(ctx context.Context) Report {
	g := w.j.Goroutines
	lat := make([]int64, g)
	t0s := make([]int64, g)
	out := make([]uint8, g)
	var e errs
	w.fm.reset()
	load := w.load(42)
	start := time.Now()
	var wg sync.WaitGroup
	for i := range g {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, w.j.Deadline)
			defer cancel()
			t0 := time.Now()
			_, err := w.c.Get(rctx, w.j.Key, load)
			lat[i] = int64(time.Since(t0))
			t0s[i] = t0.UnixNano()
			out[i] = outcome(err)
			if err != nil {
				e.add(err)
			}
		})
	}
	wg.Wait()
	if w.j.Settle > 0 {
		time.Sleep(w.j.Settle)
	}
	return w.report(Report{Ops: int64(g), Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(),
		Elapsed: int64(time.Since(start)), PG: &PGReport{Out: out, LatAll: lat}}, t0s)
}

// mix: an open-loop generator sends requests at a fixed rate (ramping up
// linearly over the warm-up), each for a Zipf-distributed key, each in its own
// goroutine with the request deadline, whether or not earlier ones returned.
func (w *pgWorker) mix(ctx context.Context) Report {
	j := w.j
	rng := rand.New(rand.NewPCG(j.Seed, 7))
	zipf := rand.NewZipf(rng, 1.1, 1, uint64(max(j.Keys, 2)-1))
	sched := schedule(j.Rate, j.Warmup, j.Duration, rng.Float64())
	keys := make([]int32, len(sched))
	sent := make([]int64, len(sched))
	out := make([]uint8, len(sched))
	lat := make([]int64, len(sched))
	age := make([]int64, len(sched))
	var e errs
	var wg sync.WaitGroup
	var maxLag time.Duration
	start := time.Now()
	for i, off := range sched {
		if d := time.Until(start.Add(off)); d > 0 {
			time.Sleep(d)
		} else {
			maxLag = max(maxLag, -d)
		}
		k := int32(zipf.Uint64())
		keys[i], sent[i] = k, time.Now().UnixNano()
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, j.Deadline)
			defer cancel()
			t0 := time.Now()
			v, err := w.c.Get(rctx, j.Key+":"+strconv.Itoa(int(k)), w.load(int64(k)))
			now := time.Now()
			lat[i] = int64(now.Sub(t0))
			if err == nil {
				age[i] = now.UnixNano() - v.UpdatedAt
			}
			out[i] = outcome(err)
			if err != nil {
				e.add(err)
			}
		})
	}
	wg.Wait()
	return w.report(Report{Ops: int64(len(keys)), Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(),
		Elapsed: int64(time.Since(start)), ReqKey: keys, ReqAt: sent,
		PG: &PGReport{Out: out, LatAll: lat, Age: age, MaxLag: int64(maxLag)}}, nil)
}

// schedule returns when to send each request of an open-loop run of length
// d at rate requests/s, the rate ramping up linearly from 0 over ramp:
// by time t ≤ ramp, rate·t²/(2·ramp) requests are due, then rate·(t − ramp/2).
// phase ∈ [0, 1) shifts the schedule by that fraction of one request, so that
// processes do not send in lockstep.
func schedule(rate float64, ramp, d time.Duration, phase float64) []time.Duration {
	var out []time.Duration
	r := ramp.Seconds()
	for n := 0; ; n++ {
		x := (float64(n) + phase) / rate // seconds at full rate
		t := x + r/2
		if x < r/2 {
			t = math.Sqrt(2 * x * r)
		}
		off := time.Duration(t * float64(time.Second))
		if off >= d {
			return out
		}
		out = append(out, off)
	}
}
