package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// The near-cache propagation scenario: a writer process moves a value to a
// new version in the "database" (a Redis key of its own) and invalidates the
// cache key; 4 watcher processes read the key through their near caches
// every 100 µs. The lag of a round is how long after the writer's Invalidate
// returned the last watcher first read the new version: the message's
// delivery, the near cache dropping its entry, and the reload (one process
// loads, the others get its push).

// Rows of the near-cache propagation table.
const (
	nearIdle   = "cacheguard (near cache), idle"
	nearLoaded = "cacheguard (near cache), beside the real-DB mix"
)

// nearWatchers is how many processes read the key through their near caches.
const nearWatchers = 4

// nearRead is how often a watcher reads the key.
const nearRead = 100 * time.Microsecond

// nearRound is the pause between the writer's rounds.
const nearRound = 20 * time.Millisecond

// nearTail is how long the watchers read on after the writer's last round:
// a round the run ended before every watcher could read is no propagation
// missed, and beside the real-DB mix a watcher may wait that long for a CPU.
const nearTail = time.Second

func dbKeyOf(key string) string { return key + ":db" }

// versionLoad is the watchers' loader: the version the database holds.
func versionLoad(rdb *redis.Client, key string) systems.Loader {
	return func(ctx context.Context) (systems.Repo, error) {
		v, err := rdb.Get(ctx, dbKeyOf(key)).Int64()
		if err != nil {
			return systems.Repo{}, err
		}
		return systems.SampleRepo(v), nil
	}
}

// nearWorker is a watcher (Kind nearwatch) or the writer (nearwrite).
type nearWorker struct {
	j   Job
	c   systems.Cache
	rdb *redis.Client // the database
}

func prepareNear(ctx context.Context, j Job) (worker, error) {
	c, err := systems.NewCache(j.System, systems.CacheConfig{Addr: j.Addrs[0]})
	if err != nil {
		return nil, err
	}
	w := &nearWorker{j: j, c: c, rdb: redis.NewClient(&redis.Options{Addr: j.Addrs[0]})}
	if j.Kind == "nearwrite" {
		if _, ok := c.(systems.Invalidator); !ok {
			w.Close()
			return nil, fmt.Errorf("%s cannot invalidate", j.System)
		}
		return w, nil
	}
	// A watcher is ready once its near cache serves the key: subscribed,
	// and trusted.
	nc, ok := c.(systems.NearCounter)
	if !ok {
		w.Close()
		return nil, fmt.Errorf("%s has no near cache", j.System)
	}
	load := versionLoad(w.rdb, j.Key)
	deadline := time.Now().Add(20 * time.Second)
	for {
		before := nc.NearHits()
		if _, err := c.Get(ctx, j.Key, load); err != nil {
			w.Close()
			return nil, fmt.Errorf("warm-up: %w", err)
		}
		if nc.NearHits() > before {
			return w, nil
		}
		if time.Now().After(deadline) {
			w.Close()
			return nil, errors.New("warm-up: the near cache served nothing in 20s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (w *nearWorker) Close() {
	w.c.Close()
	w.rdb.Close()
}

func (w *nearWorker) Run(ctx context.Context) Report {
	if w.j.Kind == "nearwrite" {
		return w.write(ctx)
	}
	return w.watch(ctx)
}

// watch reads the key every nearRead until the end of the run and records
// when it first read each version.
func (w *nearWorker) watch(ctx context.Context) Report {
	var e errs
	load := versionLoad(w.rdb, w.j.Key)
	start := time.Now()
	end := start.Add(w.j.Duration)
	var seen [][2]int64
	var last int64
	var ops int64
	for time.Now().Before(end) {
		v, err := w.c.Get(ctx, w.j.Key, load)
		ops++
		switch {
		case err != nil:
			e.add(err)
		case v.ID != last:
			last = v.ID
			seen = append(seen, [2]int64{v.ID, time.Now().UnixNano()})
		}
		time.Sleep(nearRead)
	}
	return Report{Ops: ops, Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(),
		Elapsed: int64(time.Since(start)), Seen: seen}
}

// write runs rounds after Warmup until Duration: a new version in the
// database, then Invalidate; it records when each Invalidate returned.
func (w *nearWorker) write(ctx context.Context) Report {
	var e errs
	inv := w.c.(systems.Invalidator)
	start := time.Now()
	end := start.Add(w.j.Duration)
	time.Sleep(w.j.Warmup)
	var done [][2]int64
	for v := int64(2); time.Now().Before(end); v++ {
		if err := w.rdb.Set(ctx, dbKeyOf(w.j.Key), v, time.Hour).Err(); err != nil {
			e.add(err)
			break
		}
		if err := inv.Invalidate(ctx, w.j.Key); err != nil {
			e.add(err)
			break
		}
		done = append(done, [2]int64{v, time.Now().UnixNano()})
		time.Sleep(w.j.Interval)
	}
	return Report{Ops: int64(len(done)), Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(),
		Elapsed: int64(time.Since(start)), Seen: done}
}

// propagation returns each round's lag: from the writer's Invalidate
// returning until the last watcher first read that version or a later one;
// missed counts the rounds some watcher never read.
func propagation(writer Report, watchers []Report) (lags []time.Duration, missed int) {
	for _, round := range writer.Seen {
		v, returned := round[0], round[1]
		var lag time.Duration
		ok := true
		for _, w := range watchers {
			i := slices.IndexFunc(w.Seen, func(s [2]int64) bool { return s[0] >= v })
			if i < 0 {
				ok = false
				break
			}
			lag = max(lag, time.Duration(w.Seen[i][1]-returned))
		}
		if !ok {
			missed++
			continue
		}
		lags = append(lags, lag)
	}
	return lags, missed
}

func (e *env) nearProp(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "near-prop", Title: fmt.Sprintf("8. Near-cache invalidation propagation across %d processes", nearWatchers),
		Intro: fmt.Sprintf("%d OS processes read one key through their near caches (cacheguard NearCache) every %v; "+
			"a writer process moves the value to a new version in the database and calls Invalidate, in rounds "+
			"%v apart (%v of rounds per run). The lag of a round runs from the writer's Invalidate returning until "+
			"the last of the %d processes first read the new version: the invalidation's message, the near caches "+
			"dropping their entry, and the reload (one process loads, the others get its push). *Idle*: nothing "+
			"else runs; *beside the real-DB mix*: the rounds run while the near-cache system of R2 serves its %d "+
			"processes' %.0f requests/s on PostgreSQL (after its %v ramp). *Missed*: rounds some process never "+
			"read (must be 0).", nearWatchers, nearRead, nearRound, s.nearDur, nearWatchers, s.pgMixProcs,
			s.pgMixRate, s.pgMixWarm),
		Metrics: []Metric{
			{"p50", "lag p50 ms", "%.2f"},
			{"p99", "lag p99 ms", "%.2f"},
			{"max", "lag max ms", "%.2f"},
			{"rounds", "rounds", "%.0f"},
			{"missed", "missed", "%.0f"},
			{"pub", "bare PUBLISH→receive p99 ms", "%.2f"},
		}}
	e.res.Tables = append(e.res.Tables, t)
	variants := []string{nearIdle, nearLoaded}
	for _, v := range variants {
		t.Row(v)
	}
	if _, err := e.startPG(ctx); err != nil {
		t.Row(nearLoaded).Skip = "needs PostgreSQL: " + oneLine(err.Error())
		variants = variants[:1]
	}
	for rep := range e.capped(s.newReps) {
		order := slices.Concat(variants[rep%len(variants):], variants[:rep%len(variants)])
		for _, v := range order {
			if err := ctx.Err(); err != nil {
				return err
			}
			r := t.Row(v)
			t0 := time.Now()
			err := e.nearRun(ctx, r, v == nearLoaded, rep)
			e.cfg.logf("  %-40s rep %d  %v", v, rep+1, time.Since(t0).Round(time.Millisecond))
			if err != nil {
				e.cfg.logf("  %s: %v", v, err)
				r.Errs = append(r.Errs, oneLine(err.Error()))
			}
		}
	}
	return nil
}

// nearRun is one run of the propagation scenario, beside the real-database
// mix when loaded.
func (e *env) nearRun(ctx context.Context, r *Row, loaded bool, rep int) error {
	s := e.s
	key := e.key("nearprop")
	if err := e.admin.Set(ctx, dbKeyOf(key), 1, time.Hour).Err(); err != nil {
		return err
	}
	wait, dur := 100*time.Millisecond, s.nearDur
	if loaded {
		wait = s.pgMixWarm
		dur = min(dur, s.pgMixDur-s.pgMixWarm)
	}
	jobs := []Job{{Kind: "nearwrite", System: systems.Guard, Addrs: []string{e.addr}, Key: key,
		Duration: wait + dur, Warmup: wait, Interval: nearRound}}
	for range nearWatchers {
		jobs = append(jobs, Job{Kind: "nearwatch", System: systems.GuardNear, Addrs: []string{e.addr}, Key: key,
			Duration: wait + dur + nearTail})
	}
	if loaded {
		db, err := e.startPG(ctx)
		if err != nil {
			return err
		}
		if _, err := db.WaitIdle(ctx, 15*time.Second); err != nil {
			return err
		}
		mkey := e.key("pgmix")
		for i := range s.pgMixProcs {
			// The mix runs until the watchers stop reading: it loads
			// every round, and nothing after them.
			jobs = append(jobs, Job{Kind: "pgmix", System: systems.GuardNear, Addrs: []string{e.addr}, Goroutines: 16,
				Key: mkey, Keys: s.pgMixKeys, TTL: s.pgMixTTL, Duration: wait + dur + nearTail, Warmup: s.pgMixWarm,
				Rate: s.pgMixRate / float64(s.pgMixProcs), Seed: uint64(rep*1000 + i + 1),
				DSN: db.DSN(), Pool: s.pgPool, Deadline: s.pgDeadline})
		}
	}
	pctx, stop := context.WithCancel(ctx)
	pub := make(chan []time.Duration, 1)
	go func() { pub <- e.pubProbe(pctx, key) }()
	reps, err := e.spares.run(ctx, jobs, Hooks{})
	stop()
	bare := <-pub
	if err != nil {
		return err
	}
	if len(bare) > 0 {
		r.add("pub", stats.Ms(stats.Durations(bare).P99))
	}
	lags, missed := propagation(reps[0], reps[1:1+nearWatchers])
	d := stats.Durations(lags)
	r.add("p50", stats.Ms(d.P50))
	r.add("p99", stats.Ms(d.P99))
	r.add("max", stats.Ms(d.Max))
	r.add("rounds", float64(len(reps[0].Seen)))
	r.add("missed", float64(missed))
	if err := firstErr(reps[:1+nearWatchers]); err != nil {
		return err
	}
	if len(lags) == 0 {
		return errors.New("no round measured")
	}
	return nil
}

// pubProbe measures the floor of a propagation on this Redis while the run
// goes on: a bare PUBLISH every nearRound from this process, its lag from
// the PUBLISH's return (as a round's lag starts at Invalidate's return) to
// a subscriber's receipt, until ctx ends.
func (e *env) pubProbe(ctx context.Context, key string) []time.Duration {
	sub := redis.NewClient(&redis.Options{Addr: e.addr})
	defer sub.Close()
	ch := "cgbench:pubprobe:" + key
	ps := sub.Subscribe(ctx, ch)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		return nil
	}
	msgs := ps.Channel()
	var lags []time.Duration
	tick := time.NewTicker(nearRound)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return lags
		case <-tick.C:
		}
		if e.admin.Publish(ctx, ch, "x").Err() != nil {
			continue
		}
		sent := time.Now()
		select {
		case <-ctx.Done():
			return lags
		case <-msgs:
			lags = append(lags, time.Since(sent))
		}
	}
}
