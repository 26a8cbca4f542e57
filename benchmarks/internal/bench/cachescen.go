package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// burst is one stampede: procs processes × g goroutines ask for one cold key
// at once. It returns the total loads and the pooled latencies.
type burst struct {
	loads    int64
	reqs     int64 // commands sent, all clients, (un)subscribe included
	cpu      time.Duration
	ccpu     time.Duration // the worker processes' own CPU, summed
	lat      []time.Duration
	failures error
	tl       timeline // with timeline
	tlErr    error
}

// burst runs one stampede; with timeline, the workers also record where the
// time goes (b.tl).
func (e *env) burst(ctx context.Context, system string, procs, g int, timeline bool) (burst, error) {
	key := e.key("stampede")
	if system == systems.GuardStale {
		if err := e.primeStale(ctx, key); err != nil {
			return burst{}, err
		}
	}
	var settle time.Duration
	if system == systems.GuardStale {
		// Requests return at once; the refresh runs in the background.
		settle = e.s.load + 250*time.Millisecond
	}
	jobs := make([]Job, procs)
	for i := range jobs {
		jobs[i] = Job{Kind: "stampede", System: system, Addrs: []string{e.addr}, Goroutines: g,
			Key: key, Load: e.s.load, Retry: e.s.stampRetry, Settle: settle, Timeline: timeline}
	}
	reps, cpu, subs, err := e.measured(ctx, jobs)
	if err != nil {
		return burst{}, err
	}
	b := burst{cpu: cpu, reqs: subs, failures: firstErr(reps)}
	lats := make([][]int64, len(reps))
	for i, r := range reps {
		b.loads += r.Loads
		b.reqs += r.Requests
		b.ccpu += time.Duration(r.CPU)
		lats[i] = r.Lat
		for _, v := range r.Lat {
			b.lat = append(b.lat, time.Duration(v))
		}
	}
	if timeline {
		b.tl, b.tlErr = fillTimeline(reps, lats)
	}
	return b, nil
}

// primeStale stores a value under key that is past its TTL but still
// servable, for the serve-stale system.
func (e *env) primeStale(ctx context.Context, key string) error {
	c, err := systems.NewCache(systems.GuardStale, systems.CacheConfig{Addr: e.addr})
	if err != nil {
		return err
	}
	defer c.Close()
	p, ok := c.(systems.StalePrimer)
	if !ok {
		return fmt.Errorf("%s cannot prime a stale entry", systems.GuardStale)
	}
	return p.PrimeStale(ctx, key, systems.SampleRepo(42))
}

func (e *env) stampede(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "stampede", Title: "4. Stampede on a cold key",
		Intro: fmt.Sprintf("%d OS processes × %d concurrent requests for one cold key, released together by a barrier; "+
			"the loader (the \"database\") takes %v and counts its calls. Latency is per request, pooled over all "+
			"processes. Lock-based peers: GET, on a miss take the lock, GET again, load and SET on a second miss; "+
			"redsync and bsm/redislock poll every %v (the loader's time: sooner is wasted work), rueidislock waits for "+
			"its invalidation; their runs take seconds, and they run at most %d repetition(s). Serve-stale: the key "+
			"holds a value past its TTL but inside its stale window. Requests are commands sent to Redis per request; "+
			"client CPU is the worker processes' own (getrusage), per request: on a host of 2 cores the processes' "+
			"CPU is what a burst waits for.",
			s.stampProcs, s.stampG, s.load, s.stampRetry, slowRows["stampede"].reps),
		Metrics: []Metric{
			{"loads", "loads", "%.0f"},
			{"p50", "p50 ms", "%.1f"},
			{"p99", "p99 ms", "%.1f"},
			{"max", "max ms", "%.1f"},
			{"reqs", "requests/request", "%.2f"},
			{"cpu", "Redis CPU ms", "%.1f"},
			{"ccpu", "client CPU µs/request", "%.0f"},
		}}
	tw := &Table{ID: "stampede-wake", Title: "4b. Stampede on a cold key: what is added to the load",
		Intro: timelineIntro, Metrics: timelineMetrics}
	e.res.Tables = append(e.res.Tables, t, tw)
	e.res.Notes = append(e.res.Notes, wakeNote)
	names := []string{systems.Naive, systems.Singleflight, systems.SingleflightLoad, systems.GoRedisCache,
		systems.LockRedsync, systems.LockBSM, systems.LockRueidis, systems.Guard, systems.GuardStale}
	for _, n := range names {
		if n != systems.GuardStale && e.cfg.keep(n) {
			tw.Row(n)
		}
	}
	return e.series(ctx, t, names, func(ctx context.Context, r *Row, _ int) error {
		b, err := e.burst(ctx, r.System, s.stampProcs, s.stampG, true)
		if err != nil {
			return err
		}
		if r.System != systems.GuardStale && b.tlErr == nil {
			addTimeline(tw.Row(r.System), b.tl)
		}
		d := stats.Durations(b.lat)
		r.add("loads", float64(b.loads))
		r.add("p50", stats.Ms(d.P50))
		r.add("p99", stats.Ms(d.P99))
		r.add("max", stats.Ms(d.Max))
		r.add("reqs", float64(b.reqs)/float64(max(len(b.lat), 1)))
		r.add("cpu", stats.Ms(b.cpu))
		r.add("ccpu", float64(b.ccpu.Microseconds())/float64(max(len(b.lat), 1)))
		for _, l := range b.lat {
			e.res.StampedeLat[r.System] = append(e.res.StampedeLat[r.System], stats.Ms(l))
		}
		return b.failures
	})
}

func (e *env) warm(ctx context.Context) error {
	s := e.s
	metrics := []Metric{
		{"ops", "reads/s", "%.0f"},
		{"p50", "p50 µs", "%.0f"},
		{"p99", "p99 µs", "%.0f"},
		{"allocs", "allocs/read", "%.1f"},
		{"reqs", "requests/read", "%.2f"},
		{"csw", "context switches/read", "%.2f"},
		{"vcsw", "voluntary/read", "%.2f"},
		{"sys", "read+write syscalls/read", "%.2f"},
		{"wake", "goroutine wake-ups/read", "%.2f"},
		{"hand", "hand-offs/read", "%.3f"},
		{"loads", "loads", "%.0f"},
	}
	names := []string{systems.Guard, systems.GuardHandOff, systems.GuardTimeouts, systems.GuardMsgPack, systems.GuardNear, systems.RawGetDecode, systems.GoRedisGet, systems.GoRedisLocal}
	for _, keys := range []int{1, s.warmKeys} {
		t := &Table{ID: "warm-" + strconv.Itoa(keys), Title: fmt.Sprintf("5. Warm hit path, %d key(s)", keys),
			Intro: fmt.Sprintf("One process, %d goroutines reading %d warm key(s) round-robin for %v per run. "+
				"Raw GET + decode is GET then encoding/json into the struct; go-redis/cache uses its default msgpack "+
				"codec, no local cache. cacheguard's client has ContextTimeoutEnabled, as its README asks; without it "+
				"and with go-redis's default timeouts (5 s each way: the hand-off row) each read goes through a goroutine "+
				"of the Guard's, so that a Get keeps its wait budget; with ReadTimeout and WriteTimeout of 400 ms, which fit "+
				"within the command's bound (1 s), it reads on the caller's goroutine. The MsgPack row is cacheguard with its "+
				"opt-in MsgPack codec, the codec go-redis/cache uses; its default JSON codec decodes with segmentio/encoding/json where encoding/json's rules allow (cacheguard.JSON). The near cache (cacheguard NearCache) and go-redis/cache's "+
				"local TinyLFU tier serve from memory. A load here would be a bug.", s.warmG, keys, s.warmDur),
			Metrics: metrics}
		if keys == 1 {
			t.Intro += " With one hot key, in-process coalescing (cacheguard's singleflight) shares reads."
		}
		if keys > 1 {
			t.Intro += wakesIntro
		}
		e.res.Tables = append(e.res.Tables, t)
		err := e.series(ctx, t, names, func(ctx context.Context, r *Row, _ int) error {
			return e.warmRun(ctx, r, s.warmG, keys, s.warmDur, keys > 1)
		})
		if err != nil {
			return err
		}
	}
	lone := &Table{ID: "lone-hit", Title: fmt.Sprintf("5c. Warm hit path, %d keys, one goroutine: what a read asks of the kernel", s.warmKeys),
		Intro: fmt.Sprintf("Scenario 5 with one goroutine, for %v per run: every read is a round trip of its own. "+
			"Context switches and read/write system calls per read are the worker process's own, as in table 1c."+wakesIntro, s.loneDur),
		Metrics: metrics}
	e.res.Tables = append(e.res.Tables, lone)
	return e.series(ctx, lone, []string{systems.Guard, systems.GuardHandOff, systems.GuardTimeouts, systems.GuardMsgPack, systems.RawGetDecode, systems.GoRedisGet},
		func(ctx context.Context, r *Row, _ int) error {
			return e.warmRun(ctx, r, 1, s.warmKeys, s.loneDur, true)
		})
}

// warmRun records one run of g goroutines reading keys warm keys for d;
// with wakes, who woke its goroutines too (see wakes).
func (e *env) warmRun(ctx context.Context, r *Row, g, keys int, d time.Duration, wakes bool) error {
	job := Job{Kind: "warm", System: r.System, Addrs: []string{e.addr}, Goroutines: g, Duration: d, Key: e.key("warm"), Keys: keys, Load: e.s.load}
	reps, _, _, err := e.measured(ctx, []Job{job})
	if err != nil {
		return err
	}
	rep := reps[0]
	if rep.Dist == nil {
		return fmt.Errorf("no latencies reported")
	}
	dist := *rep.Dist
	ops := float64(max(rep.Ops, 1))
	r.add("ops", ops/time.Duration(rep.Elapsed).Seconds())
	r.add("p50", float64(dist.P50)/1e3)
	r.add("p99", float64(dist.P99)/1e3)
	r.add("allocs", float64(rep.Mallocs)/ops)
	r.add("reqs", float64(rep.Requests)/ops)
	r.add("csw", float64(rep.CSw)/ops)
	r.add("vcsw", float64(rep.VCSw)/ops)
	if rep.Syscalls >= 0 {
		r.add("sys", float64(rep.Syscalls)/ops)
	}
	r.add("loads", float64(rep.Loads))
	if err := firstErr(reps); err != nil || !wakes {
		return err
	}
	wake, hand, err := e.wakes(ctx, job)
	if err == nil {
		r.add("wake", wake)
		r.add("hand", hand)
	}
	return err
}

var scaleSystems = []string{systems.Naive, systems.Singleflight, systems.GoRedisCache, systems.Guard}

func (e *env) scale(ctx context.Context) error {
	s := e.s
	type point struct {
		procs, g int
		col      string
		x        float64 // on the chart: processes, or total requests
	}
	var byProcs, byTotal []point
	for _, p := range s.scaleProcs {
		byProcs = append(byProcs, point{p, s.scaleG, fmt.Sprintf("%d×%d", p, s.scaleG), float64(p)})
	}
	for _, n := range s.scaleTotals {
		byTotal = append(byTotal, point{s.scaleFixedP, max(n/s.scaleFixedP, 1), fmt.Sprintf("%d", n), float64(n)})
	}
	// A point of both sweeps (8 processes × 128 requests: 1024 in all) runs
	// once per system and repetition; the second sweep reads the first's.
	type measured struct{ loads, p99 float64 }
	ran := map[string]measured{}
	sweep := func(id, title, intro string, pts []point) error {
		tl := &Table{ID: id + "-loads", Title: title + ": loads", Intro: intro}
		tp := &Table{ID: id + "-p99", Title: title + ": p99 latency (ms)"}
		for _, p := range pts {
			tl.Metrics = append(tl.Metrics, Metric{p.col, p.col, "%.0f"})
			tp.Metrics = append(tp.Metrics, Metric{p.col, p.col, "%.0f"})
			tl.X = append(tl.X, p.x)
			tp.X = append(tp.X, p.x)
		}
		for _, sys := range scaleSystems {
			tp.Row(sys)
		}
		e.res.Tables = append(e.res.Tables, tl, tp)
		return e.series(ctx, tl, scaleSystems, func(ctx context.Context, r *Row, rep int) error {
			rp := tp.Row(r.System)
			var errs []string
			for _, p := range pts {
				key := fmt.Sprintf("%s|%d×%d|%d", r.System, p.procs, p.g, rep)
				m, ok := ran[key]
				if !ok {
					b, err := e.burst(ctx, r.System, p.procs, p.g, false)
					if err != nil {
						return err
					}
					if b.failures != nil {
						errs = append(errs, p.col+": "+b.failures.Error())
					}
					m = measured{float64(b.loads), stats.Ms(stats.Durations(b.lat).P99)}
					ran[key] = m
				}
				r.add(p.col, m.loads)
				rp.add(p.col, m.p99)
			}
			if len(errs) > 0 {
				return fmt.Errorf("%s", strings.Join(errs, "; "))
			}
			return nil
		})
	}
	intro := fmt.Sprintf("The stampede of scenario 4 (cold key, %v loader) as processes × concurrent requests per process grow.", s.load)
	if err := sweep("scale-procs", "6a. Scale with processes (processes × requests each)", intro, byProcs); err != nil {
		return err
	}
	intro = fmt.Sprintf("%d processes; the column is the total number of concurrent requests.", s.scaleFixedP)
	for _, b := range byTotal {
		for _, a := range byProcs {
			if a.procs == b.procs && a.g == b.g {
				intro += fmt.Sprintf(" The %s column is 6a's %s runs.", b.col, a.col)
			}
		}
	}
	if err := sweep("scale-total", "6b. Scale with concurrent requests", intro, byTotal); err != nil {
		return err
	}
	for _, id := range []string{"scale-procs-p99", "scale-total-p99"} {
		for _, sys := range scaleSystems {
			if r := e.res.Table(id).Row(sys); systems.Available(sys) != nil {
				r.Skip = "TODO: not merged yet"
			}
		}
	}
	return nil
}

var mixSystems = []string{systems.Naive, systems.Singleflight, systems.GoRedisCache, systems.Guard, systems.GuardSWR}

func (e *env) mix(ctx context.Context) error {
	s := e.s
	reps := e.reps
	if s.mixReps > 0 && e.cfg.Reps == 0 { // -reps overrides the cap
		reps = min(reps, s.mixReps)
	}
	rate := float64(s.mixProcs*s.mixG) / s.mixInterval.Seconds()
	t := &Table{ID: "mix", Title: "6c. Hot-key mix",
		Intro: fmt.Sprintf("%d processes × %d goroutines, each sending one request every %v (%.0f requests/s offered) "+
			"for %v per run, %d repetitions; keys drawn from a Zipf distribution (s=1.1) over %d keys that expire %v "+
			"after each fill (before cacheguard's default 10%% jitter); the loader takes %v. Every figure is taken "+
			"after the first %v (the cold start, the same for every system): requests/s and latency of the requests "+
			"sent after it, DB loads started after it per second, and *peak*, the most loads started in any 100 ms "+
			"window after it, as a rate. *Loads ÷ ideal* covers the whole run: every load over the fewest that "+
			"could serve the same requests (one per key per %v window actually requested).",
			s.mixProcs, s.mixG, s.mixInterval, rate, s.mixDur, reps, s.mixKeys, s.mixTTL, s.load, s.mixTTL, s.mixTTL),
		Metrics: []Metric{
			{"rps", "requests/s", "%.0f"},
			{"lps", "DB loads/s", "%.0f"},
			{"peak", "peak DB loads/s", "%.0f"},
			{"p50", "p50 ms", "%.2f"},
			{"p99", "p99 ms", "%.1f"},
			{"ideal", "loads ÷ ideal", "%.2f"},
		}}
	e.res.Tables = append(e.res.Tables, t)
	return e.seriesN(ctx, reps, t, mixSystems, func(ctx context.Context, r *Row, rep int) error {
		key := e.key("mix")
		jobs := make([]Job, s.mixProcs)
		for i := range jobs {
			jobs[i] = Job{Kind: "mix", System: r.System, Addrs: []string{e.addr}, Goroutines: s.mixG,
				Duration: s.mixDur, Interval: s.mixInterval, Key: key, Keys: s.mixKeys, TTL: s.mixTTL, Load: s.load,
				Warmup: s.mixTTL, Seed: uint64(rep*1000 + i + 1)}
		}
		reps, _, _, err := e.measured(ctx, jobs)
		if err != nil {
			return err
		}
		var from, to int64 = math.MaxInt64, 0
		for _, rp := range reps {
			from = min(from, rp.Start+int64(s.mixTTL))
			to = max(to, rp.Start+rp.Elapsed)
		}
		var at []int64
		var lat []time.Duration
		var keys []int32
		var sent []int64
		var loads int64
		for _, rp := range reps {
			keys = append(keys, rp.ReqKey...)
			sent = append(sent, rp.ReqAt...)
			loads += rp.Loads
			for _, a := range rp.LoadAt {
				if a >= from {
					at = append(at, a)
				}
			}
			for _, v := range rp.Lat {
				lat = append(lat, time.Duration(v))
			}
		}
		peak := peakIn(at, 100*time.Millisecond)
		window := time.Duration(to - from).Seconds()
		d := stats.Durations(lat)
		r.add("rps", float64(len(lat))/window)
		r.add("lps", float64(len(at))/window)
		r.add("peak", float64(peak)*10)
		r.add("p50", stats.Ms(d.P50))
		r.add("p99", stats.Ms(d.P99))
		r.add("ideal", float64(loads)/float64(max(idealLoads(keys, sent, s.mixTTL), 1)))
		return firstErr(reps)
	})
}

// micro runs the Go micro-benchmarks (benchstat-friendly output), each a
// fixed number of iterations (an adaptive -benchtime spends most of its time
// finding one): the test binary is built once and runs them all, then the
// BenchmarkWarmGetMany family (100 keys per iteration) with fewer iterations
// — its 100 Gets in a row take ~7 ms an iteration, its GetMany ~0.4 ms,
// whose 50 iterations (20 ms) were too few for a steady figure — its two
// sides alternating.
func (e *env) micro(ctx context.Context) error {
	if e.cfg.MicroDir == "" {
		e.res.Notes = append(e.res.Notes, "micro-benchmarks skipped: no module directory")
		return nil
	}
	s := e.s
	tmp, err := os.MkdirTemp("", "cgbench-micro")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "micro.test")
	build := exec.CommandContext(ctx, "go", "test", "-c", "-o", bin, "./micro/")
	build.Dir = e.cfg.MicroDir
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("go test -c: %w\n%s", err, out)
	}
	const many = "^BenchmarkWarmGetMany$"
	// GetMany and its 100 Gets in a row alternate, one run each at a time,
	// so that the ratio of their medians compares runs made minutes apart at
	// most, not a batch of one side against a batch of the other.
	runs := [][]string{{"-test.bench", ".", "-test.skip", many, "-test.benchtime", s.microIters, "-test.count", strconv.Itoa(s.microCount)}}
	for range s.microCount {
		runs = append(runs, []string{"-test.bench", many + "/./^many$", "-test.benchtime", s.microIterBatch, "-test.count", "1"},
			[]string{"-test.bench", many + "/./^sequential$", "-test.benchtime", s.microIterMany, "-test.count", "1"})
	}
	var all []string
	for i, run := range runs {
		cmd := exec.CommandContext(ctx, bin, append([]string{"-test.run", "^$", "-test.benchmem"}, run...)...)
		cmd.Dir = filepath.Join(e.cfg.MicroDir, "micro")
		cmd.Env = append(os.Environ(), "CGBENCH_REDIS="+e.addr)
		out, err := cmd.CombinedOutput()
		text := strings.TrimSpace(string(out))
		if i > 0 && err == nil { // the header (goos, pkg, cpu) once: benchstat reads it for every line after it
			var lines []string
			for l := range strings.Lines(text) {
				if strings.HasPrefix(l, "Benchmark") {
					lines = append(lines, strings.TrimRight(l, "\n"))
				}
			}
			text = strings.Join(lines, "\n")
		}
		all = append(all, text)
		if err != nil {
			e.res.Micro = strings.Join(all, "\n")
			return fmt.Errorf("micro-benchmarks: %w\n%s", err, out)
		}
	}
	e.res.Micro = strings.Join(all, "\n")
	return nil
}
