package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// The near-cache propagation scenario: a writer process moves a value to a
// new version in the "database" (a Redis key of its own) and invalidates the
// cache key; 4 watcher processes read the key through their near caches
// every 100 µs. Two lags per round, from the writer's Invalidate returning
// until the last watcher: dropped the key from its near cache (its
// observer's EventNearInvalidated: the invalidation's message delivered and
// applied), and served the new version (the reload too — one process loads,
// the others get its push).

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

	mu      sync.Mutex
	dropped []int64 // when the near cache dropped the key (unix ns)
}

func prepareNear(ctx context.Context, j Job) (worker, error) {
	w := &nearWorker{j: j}
	c, err := systems.NewCache(j.System, systems.CacheConfig{Addr: j.Addrs[0], Dropped: func(key string) {
		if key == j.Key {
			at := time.Now().UnixNano()
			w.mu.Lock()
			w.dropped = append(w.dropped, at)
			w.mu.Unlock()
		}
	}})
	if err != nil {
		return nil, err
	}
	w.c, w.rdb = c, redis.NewClient(&redis.Options{Addr: j.Addrs[0]})
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
	// The floor, in this process: a bare PUBLISH's receipt (see pubProbe).
	probes := make(chan [][2]int64, 1)
	pctx, stop := context.WithCancel(ctx)
	go func() { probes <- receiveProbes(pctx, w.rdb, probeChannel(w.j.Key)) }()
	defer stop()
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
	stop()
	w.mu.Lock()
	dropped := slices.Clone(w.dropped)
	w.mu.Unlock()
	return Report{Ops: ops, Errors: e.n.Load(), FirstErr: e.first, Start: start.UnixNano(),
		Elapsed: int64(time.Since(start)), Seen: seen, Dropped: dropped, Probes: <-probes}
}

func probeChannel(key string) string { return "cgbench:pubprobe:" + key }

// receiveProbes records the receipt of each probe on ch until ctx ends.
func receiveProbes(ctx context.Context, rdb *redis.Client, ch string) [][2]int64 {
	ps := rdb.Subscribe(ctx, ch)
	defer ps.Close()
	var got [][2]int64
	msgs := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return got
		case m, ok := <-msgs:
			if !ok {
				return got
			}
			if n, err := strconv.ParseInt(m.Payload, 10, 64); err == nil {
				got = append(got, [2]int64{n, time.Now().UnixNano()})
			}
		}
	}
}

// probeLags returns each probe's lag from its PUBLISH returning (sent) until
// the last of the watchers received it; a probe some watcher did not
// receive (not subscribed yet, or after it stopped) is left out.
func probeLags(sent map[int64]int64, watchers []Report) []time.Duration {
	var lags []time.Duration
	for n, at := range sent {
		var lag time.Duration
		ok := true
		for _, w := range watchers {
			i := slices.IndexFunc(w.Probes, func(p [2]int64) bool { return p[0] == n })
			if i < 0 {
				ok = false
				break
			}
			lag = max(lag, time.Duration(w.Probes[i][1]-at))
		}
		if ok {
			lags = append(lags, lag)
		}
	}
	return lags
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

// propagation returns each round's lags, from the writer's Invalidate
// returning until the last watcher served the new version (served: its
// first read of that version or a later one returned) and until the last
// one's near cache dropped the key (dropped: its first drop from 5 ms
// before; the previous round's fill, heard as a drop too, is 15 ms older;
// never below 0); missed counts the rounds some watcher never read.
func propagation(writer Report, watchers []Report) (served, dropped []time.Duration, missed int) {
	for _, round := range writer.Seen {
		v, returned := round[0], round[1]
		var lag, drop time.Duration
		ok := true
		for _, w := range watchers {
			i := slices.IndexFunc(w.Seen, func(s [2]int64) bool { return s[0] >= v })
			j := slices.IndexFunc(w.Dropped, func(at int64) bool { return at >= returned-int64(5*time.Millisecond) })
			if i < 0 || j < 0 {
				ok = false
				break
			}
			lag = max(lag, time.Duration(w.Seen[i][1]-returned))
			drop = max(drop, time.Duration(w.Dropped[j]-returned))
		}
		if !ok {
			missed++
			continue
		}
		served, dropped = append(served, lag), append(dropped, drop)
	}
	return served, dropped, missed
}

func (e *env) nearProp(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "near-prop", Title: fmt.Sprintf("8. Near-cache invalidation propagation across %d processes", nearWatchers),
		Intro: fmt.Sprintf("%d OS processes read one key through their near caches (cacheguard NearCache) every %v; "+
			"a writer process moves the value to a new version in the database and calls Invalidate, in rounds "+
			"%v apart (%v of rounds per run). Two lags per round, from the writer's Invalidate returning until "+
			"the last of the %d processes: *dropped the old value* (its near cache dropped the key: the "+
			"invalidation's message delivered and applied, seen by the process's observer as "+
			"EventNearInvalidated), and *served the new value* (its first read of it returned: the reload too, "+
			"one process loading, the others getting its push). *Idle*: nothing "+
			"else runs; *beside the real-DB mix*: the rounds run while the near-cache system of R2 serves its %d "+
			"processes' %.0f requests/s on PostgreSQL (after its %v ramp). *Missed*: rounds some process never "+
			"read (must be 0). *Bare PUBLISH→receive*: a PUBLISH every %v from the benchmark's process, from its "+
			"return until the last of the %d processes received it (the floor where the invalidations are received), "+
			"and until an idle process did.", nearWatchers, nearRead, nearRound, s.nearDur, nearWatchers, s.pgMixProcs,
			s.pgMixRate, s.pgMixWarm, nearRound, nearWatchers),
		Metrics: []Metric{
			{"drop50", "dropped the old: p50 ms", "%.2f"},
			{"drop99", "dropped the old: p99 ms", "%.2f"},
			{"p50", "served the new: p50 ms", "%.2f"},
			{"p99", "served the new: p99 ms", "%.2f"},
			{"max", "served the new: max ms", "%.2f"},
			{"rounds", "rounds", "%.0f"},
			{"missed", "missed", "%.0f"},
			{"floor", "bare PUBLISH→receive by the 4 processes: p99 ms", "%.2f"},
			{"pub", "bare PUBLISH→receive by an idle process: p99 ms", "%.2f"},
			{"drop99all", "dropped the old: p99 ms of all rounds", "%.2f"},
			{"floor99all", "bare PUBLISH→receive by the 4 processes: p99 ms of all probes", "%.2f"},
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
	// A p99 of one repetition's 140 rounds is its second-largest lag, and the
	// floor's as few probes: the targets compare p99s of every repetition's
	// rounds and probes taken together (the lags of each are kept in rows'
	// unlisted metrics "drops" and "floors", in ms).
	defer func() {
		for _, v := range variants {
			r := t.Row(v)
			for _, m := range [][2]string{{"drops", "drop99all"}, {"floors", "floor99all"}} {
				if lags := r.vals[m[0]]; len(lags) > 0 {
					ds := make([]time.Duration, len(lags))
					for i, ms := range lags {
						ds[i] = time.Duration(ms * float64(time.Millisecond))
					}
					r.add(m[1], stats.Ms(stats.Durations(ds).P99))
				}
			}
		}
	}()
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
	// Either variant begins once PostgreSQL runs no query: the idle one
	// follows the real-DB mix or the loaded variant, whose requests that gave
	// up can leave their queries running on the server ("idle": nothing else
	// runs).
	if e.pg != nil {
		if _, err := e.pg.WaitIdle(ctx, 15*time.Second); err != nil {
			return err
		}
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
	type probed struct {
		lags []time.Duration
		sent map[int64]int64
	}
	pub := make(chan probed, 1)
	go func() {
		lags, sent := e.pubProbe(pctx, key)
		pub <- probed{lags, sent}
	}()
	reps, err := e.spares.run(ctx, jobs, Hooks{})
	stop()
	bare := <-pub
	if err != nil {
		return err
	}
	if len(bare.lags) > 0 {
		r.add("pub", stats.Ms(stats.Durations(bare.lags).P99))
	}
	if fl := probeLags(bare.sent, reps[1:1+nearWatchers]); len(fl) > 0 {
		r.add("floor", stats.Ms(stats.Durations(fl).P99))
		for _, l := range fl {
			r.add("floors", stats.Ms(l))
		}
	}
	lags, drops, missed := propagation(reps[0], reps[1:1+nearWatchers])
	for _, l := range drops {
		r.add("drops", stats.Ms(l))
	}
	dd := stats.Durations(drops)
	r.add("drop50", stats.Ms(dd.P50))
	r.add("drop99", stats.Ms(dd.P99))
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
// goes on: a bare PUBLISH of a probe number every nearRound from this
// process. It returns its lag from the PUBLISH's return (as a round's lag
// starts at Invalidate's return) to the receipt by a subscriber of this
// process, idle but for it, and when each PUBLISH returned, for the lag to
// the watchers' receipt (see probeLags): the floor in the processes that
// receive the invalidations.
func (e *env) pubProbe(ctx context.Context, key string) ([]time.Duration, map[int64]int64) {
	sent := map[int64]int64{}
	sub := redis.NewClient(&redis.Options{Addr: e.addr})
	defer sub.Close()
	ch := probeChannel(key)
	ps := sub.Subscribe(ctx, ch)
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		return nil, sent
	}
	msgs := ps.Channel()
	var lags []time.Duration
	tick := time.NewTicker(nearRound)
	defer tick.Stop()
	for n := int64(1); ; n++ {
		select {
		case <-ctx.Done():
			return lags, sent
		case <-tick.C:
		}
		if e.admin.Publish(ctx, ch, strconv.FormatInt(n, 10)).Err() != nil {
			continue
		}
		at := time.Now()
		sent[n] = at.UnixNano()
		select {
		case <-ctx.Done():
			return lags, sent
		case <-msgs:
			lags = append(lags, time.Since(at))
		}
	}
}
