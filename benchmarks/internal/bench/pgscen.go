package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// pgSystems run on the real database, in this order.
var pgSystems = []string{systems.Naive, systems.Singleflight, systems.GoRedisCache, systems.GoRedisLocal,
	systems.Guard, systems.GuardSWR, systems.GuardNear}

// PGInfo describes the real database of a run.
type PGInfo struct {
	Version string
	Rows    int
	Alone   time.Duration // the loader's query on the idle server
	Pool    int           // connections per worker process
	Share   float64       // the table's size was chosen by it (see Config.PGShare); 0: fixed
	CPUs    int           // of the host, which Share is a share of
}

// Series is one run of the real-database mix over time, in buckets of Bucket
// from the first worker's start: requests completed and failed (by the time
// they returned) and queries sent to the database.
type Series struct {
	Bucket            time.Duration
	Done, Failed, Qry []int
}

// startPG starts the real database once per run; it notes why when it cannot.
func (e *env) startPG(ctx context.Context) (*pgdb.Server, error) {
	if e.pg != nil || e.pgErr != nil {
		return e.pg, e.pgErr
	}
	t0 := time.Now()
	e.pg, e.pgErr = pgdb.Start(ctx, pgdb.Options{Rows: e.s.pgRows, Alone: e.s.pgAlone(), Repos: 100_000, MaxConnections: 400})
	if e.pgErr != nil {
		return nil, e.pgErr
	}
	e.res.PG = &PGInfo{Version: e.pg.Version, Rows: e.pg.Rows(), Alone: e.pg.Alone, Pool: e.s.pgPool, Share: e.s.pgShare, CPUs: runtime.NumCPU()}
	e.cfg.logf("  PostgreSQL ready in %v: %d rows, the loader's query alone %v", time.Since(t0).Round(time.Millisecond),
		e.pg.Rows(), e.pg.Alone.Round(100*time.Microsecond))
	return e.pg, nil
}

// pgAlone is how long the loader's query should take alone for the mix's
// ideal to ask pgShare of the host's CPU time of the database: keys ÷ TTL
// queries a second (0: the table's size is fixed).
func (s sizes) pgAlone() time.Duration {
	if s.pgShare <= 0 {
		return 0
	}
	perSec := float64(s.pgMixKeys) / s.pgMixTTL.Seconds()
	return time.Duration(s.pgShare * float64(runtime.NumCPU()) / perSec * float64(time.Second))
}

// pgSkip records that the real-database scenarios cannot run, and why; the
// other scenarios still run.
func (e *env) pgSkip(err error) error {
	note := "real-database scenarios skipped: " + oneLine(err.Error())
	if !slices.Contains(e.res.Notes, note) {
		e.res.Notes = append(e.res.Notes, note)
		e.cfg.logf("  %s", note)
	}
	return nil
}

// pgRun is one measured run on the real database.
type pgRun struct {
	reps []Report
	pg   pgdb.Counters // what the server counted between GO and the end of the run's queries
}

// measuredPG runs jobs like measured, reading the server's counters at GO
// and once the run's last query has ended (queries whose clients gave up run
// to their end, and count).
func (e *env) measuredPG(ctx context.Context, db *pgdb.Server, jobs []Job) (pgRun, error) {
	if n, err := db.WaitIdle(ctx, 15*time.Second); err != nil {
		return pgRun{}, err
	} else if n > 0 {
		e.cfg.logf("  PostgreSQL still runs %d queries of the previous run", n)
	}
	var c0, c1 pgdb.Counters
	var e0, e1 error
	reps, err := e.spares.run(ctx, jobs, Hooks{
		BeforeGo: func() { c0, e0 = db.Snapshot(ctx) },
		AfterRun: func() {
			_, e1 = db.WaitIdle(ctx, 15*time.Second)
			if e1 == nil {
				c1, e1 = db.Snapshot(ctx)
			}
		},
	})
	if err == nil {
		err = errors.Join(e0, e1)
	}
	if err != nil {
		return pgRun{}, err
	}
	return pgRun{reps: reps, pg: c1.Sub(c0)}, nil
}

// pgCounts sums the loader counts and request outcomes of a run.
type pgCounts struct {
	sent, ok, poolFails, queryErrs int64
	out                            [outOther + 1]int64
}

func sumPG(reps []Report) pgCounts {
	var c pgCounts
	for _, r := range reps {
		if r.PG == nil {
			continue
		}
		c.sent += r.PG.Sent
		c.ok += r.PG.OK
		c.poolFails += r.PG.PoolFails
		c.queryErrs += r.PG.QueryErrs
		for _, o := range r.PG.Out {
			c.out[o]++
		}
	}
	return c
}

func (c pgCounts) failed() int64 {
	return c.out[outPool] + c.out[outQuery] + c.out[outTimeout] + c.out[outOther]
}

func (e *env) pgStampede(ctx context.Context) error {
	s := e.s
	db, err := e.startPG(ctx)
	if err != nil {
		return e.pgSkip(err)
	}
	t := &Table{ID: "pg-stampede", Title: "R1. Stampede on a cold key, real PostgreSQL",
		Intro: fmt.Sprintf("Scenario 4 on the real database: %d OS processes × %d concurrent requests for one cold key, "+
			"released together, each request with a %v deadline; the loader runs the aggregate query (%s alone) through "+
			"a pool of %d connections per process, each of which has run the query before the run (as in a service "+
			"that has been up: a backend's first scan costs more; worker processes and their pools serve run after "+
			"run, and a connection a run closed is replaced and warmed before the next). *Queries sent* and *answered* are counted by the loaders, "+
			"*completed* by PostgreSQL (pg_stat_statements counts a query that ran to its end, also when its client "+
			"had given up: at the deadline pgx closes the connection and the server runs the query on; a query the "+
			"server cut short on finding its client gone is not counted); *failed* are "+
			"requests that returned an error, by cause: *pool* found no free connection before their "+
			"deadline, *query* got the query's error (or its deadline), *timeout* reached the deadline waiting for another caller's load, *other* anything else (make bench's log prints the first error of a repetition that had one). Latency covers every request, a failed one at the time it failed. PG CPU is the user+system "+
			"time of every PostgreSQL process from GO until the run's last query ended (the kernel counts it in "+
			"10 ms ticks per process). Naive cache-aside, per-process singleflight and the go-redis/cache rows "+
			"run at most %d repetitions.",
			s.stampProcs, s.stampG, s.pgDeadline, db.Alone.Round(100*time.Microsecond), s.pgPool, slowRows["pg-stampede"].reps),
		Metrics: []Metric{
			{"loads", "queries sent", "%.0f"},
			{"answered", "answered", "%.0f"},
			{"running", "running at the end", "%.0f"},
			{"pgcalls", "completed (PostgreSQL)", "%.0f"},
			{"failed", "failed", "%.0f"},
			{"pool", "pool", "%.0f"},
			{"query", "query", "%.0f"},
			{"timeout", "timeout", "%.0f"},
			{"other", "other", "%.0f"},
			{"p50", "p50 ms", "%.0f"},
			{"p99", "p99 ms", "%.0f"},
			{"max", "max ms", "%.0f"},
			{"cpu", "PG CPU ms", "%.0f"},
		}}
	tw := &Table{ID: "pg-stampede-wake", Title: "R1b. Stampede on a cold key, real PostgreSQL: what is added to the query",
		Intro: timelineIntro + " The load here is the query, measured by the loader around it.", Metrics: timelineMetrics}
	e.res.Tables = append(e.res.Tables, t, tw)
	names := slices.Clone(pgSystems)
	names[slices.Index(names, systems.GuardSWR)] = systems.GuardStale
	for _, n := range names {
		if n != systems.GuardStale && e.cfg.keep(n) {
			tw.Row(n)
		}
	}
	return e.series(ctx, t, names, func(ctx context.Context, r *Row, _ int) error {
		key := e.key("pgstampede")
		var settle time.Duration
		if r.System == systems.GuardStale {
			if err := e.primeStale(ctx, key); err != nil {
				return err
			}
			settle = 10*db.Alone + 250*time.Millisecond // the refresh runs in the background
		}
		jobs := make([]Job, s.stampProcs)
		for i := range jobs {
			jobs[i] = Job{Kind: "pgstampede", System: r.System, Addrs: []string{e.addr}, Goroutines: s.stampG,
				Key: key, TTL: time.Minute, DSN: db.DSN(), Pool: s.pgPool, Deadline: s.pgDeadline, Settle: settle,
				Timeline: true}
		}
		run, err := e.measuredPG(ctx, db, jobs)
		if err != nil {
			return err
		}
		c := sumPG(run.reps)
		if r.System != systems.GuardStale {
			lats := make([][]int64, len(run.reps))
			for i, rp := range run.reps {
				lats[i] = rp.PG.LatAll
			}
			if tl, err := fillTimeline(run.reps, lats); err == nil {
				addTimeline(tw.Row(r.System), tl)
			}
		}
		var lat []time.Duration
		for _, rp := range run.reps {
			for _, v := range rp.PG.LatAll {
				lat = append(lat, time.Duration(v))
				e.res.PGStampedeLat[r.System] = append(e.res.PGStampedeLat[r.System], stats.Ms(time.Duration(v)))
			}
		}
		d := stats.Durations(lat)
		r.add("loads", float64(c.sent))
		r.add("answered", float64(c.ok))
		r.add("pgcalls", float64(run.pg.Calls))
		r.add("failed", float64(c.failed()))
		r.add("pool", float64(c.out[outPool]))
		r.add("query", float64(c.out[outQuery]))
		r.add("timeout", float64(c.out[outTimeout]))
		r.add("other", float64(c.out[outOther]))
		if err := firstErr(run.reps); err != nil {
			e.cfg.logf("  %s: %v (queries sent %d, answered %d)", r.System, err, c.sent, c.ok)
		}
		r.add("p50", stats.Ms(d.P50))
		r.add("p99", stats.Ms(d.P99))
		r.add("max", stats.Ms(d.Max))
		r.add("cpu", stats.Ms(run.pg.CPU))
		return nil // failed requests are the measurement here, not a harness error
	})
}

func (e *env) pgMix(ctx context.Context) error {
	s := e.s
	db, err := e.startPG(ctx)
	if err != nil {
		return e.pgSkip(err)
	}
	reps := e.reps
	if s.pgMixReps > 0 && e.cfg.Reps == 0 { // -reps overrides the cap
		reps = min(reps, s.pgMixReps)
	}
	t := &Table{ID: "pg-mix", Title: "R2. Hot-key mix, real PostgreSQL: requests",
		Intro: fmt.Sprintf("%d OS processes offer %.0f requests/s in all, open loop (each request is sent on schedule "+
			"in its own goroutine, whether or not earlier ones returned, with a %v deadline), ramping up linearly over "+
			"the first %v; keys are drawn from a Zipf distribution (s=1.1) over %d keys whose entries expire %v after "+
			"each fill; the loader runs the aggregate query (%s alone, %d rows scanned) through a pool of %d "+
			"connections per process, each warmed as in R1 (one load of every key per TTL, the ideal, asks PostgreSQL "+
			"for %.2f s of that query a second: the mix stays fresh only while the database gets that much of the "+
			"host's %d CPUs beside the workers); %v per run, %d repetitions (the go-redis/cache and near-cache rows at most %d). Figures "+
			"cover the requests sent after the ramp "+
			"(the last %v, about %.0f requests a repetition): "+
			"*completed/s* those that succeeded; *failed* those that returned an error, *pool* of them for want of a "+
			"free connection, *query* of them while their query ran (the rest waited for another caller's load); "+
			"latency over every request, a failed one at the time it failed; *age* of the value a request was "+
			"served: how long before the request returned the query that produced it had returned (a value served "+
			"from a cache that honours the TTL is at most about %v old).",
			s.pgMixProcs, s.pgMixRate, s.pgDeadline, s.pgMixWarm, s.pgMixKeys, s.pgMixTTL,
			db.Alone.Round(100*time.Microsecond), db.Rows(), s.pgPool,
			float64(s.pgMixKeys)*db.Alone.Seconds()/s.pgMixTTL.Seconds(), runtime.NumCPU(),
			s.pgMixDur, reps, slowRows["pg-mix"].reps,
			s.pgMixDur-s.pgMixWarm, s.pgMixRate*(s.pgMixDur-s.pgMixWarm).Seconds(), s.pgMixTTL),
		Metrics: []Metric{
			{"rps", "completed/s", "%.0f"},
			{"failed", "failed", "%.0f"},
			{"pool", "pool", "%.0f"},
			{"query", "query", "%.0f"},
			{"p50", "p50 ms", "%.1f"},
			{"p99", "p99 ms", "%.0f"},
			{"max", "max ms", "%.0f"},
			{"age99", "age p99 s", "%.2f"},
			{"agemax", "age max s", "%.2f"},
		}}
	tdb := &Table{ID: "pg-mix-db", Title: "R2. Hot-key mix, real PostgreSQL: database",
		Intro: fmt.Sprintf("The same runs. *Peak* is the most queries sent in any 100 ms after the ramp. The rest "+
			"covers the whole run: queries *sent* and *answered* counted by the loaders, *completed* by PostgreSQL "+
			"(pg_stat_statements, as in R1); PG CPU (all PostgreSQL processes, until the run's last query ended) and "+
			"its cost per 1000 completed requests; *running at the end*, queries still running when the run's "+
			"last request had returned (early refreshes begun in its last moments: no request of the run was "+
			"served their values); *loads ÷ ideal*, the queries that returned over the ideal, one load per key per "+
			"%v window actually requested (the fewest loads that serve every request with a value at most %v old); "+
			"*overlapping*, queries sent for a key while another query for the same key was running (duplicate "+
			"work no coordination would allow); *early*, queries sent for a key less than %v after its previous "+
			"query returned (a refresh before the value expired: cacheguard's TTL jitter and early refresh, or a "+
			"value whose entry expired early).", s.pgMixTTL, s.pgMixTTL, s.pgMixTTL),
		Metrics: []Metric{
			{"peak", "peak queries/100 ms", "%.0f"},
			{"loads", "queries sent", "%.0f"},
			{"answered", "answered", "%.0f"},
			{"running", "running at the end", "%.0f"},
			{"pgcalls", "completed (PostgreSQL)", "%.0f"},
			{"cpu", "PG CPU s", "%.1f"},
			{"cpuk", "PG CPU ms/1k completed", "%.0f"},
			{"ideal", "loads ÷ ideal", "%.2f"},
			{"overlap", "overlapping", "%.0f"},
			{"early", "early", "%.0f"},
		}}
	e.res.Tables = append(e.res.Tables, t, tdb)
	e.res.Notes = append(e.res.Notes, "Real-DB loads ÷ ideal: cacheguard never ran two queries for one key at "+
		"once (R2's *overlapping* column); its loads above the ideal are *early* ones: a hit on a hot key "+
		"refreshes it once within its lead of expiry (Δ·β·(2 + 2u), Δ its last load's duration, u drawn once per "+
		"value; never more than a point between TTL/8 and TTL/4 drawn the same way, so that keys filled together "+
		"refresh apart), and a refresh late all the same has the value "+
		"served Stale past it for twice its last load, between TTL/4 and TTL/2, and beyond that up to the TTL to the calls "+
		"that find its reload running, so a hot key does not expire under its readers; the TTL "+
		"jitter (a random 0–10% shorter) applies to values loaded on a miss or served stale, so that keys "+
		"filled together expire apart (an early refresh keeps the whole TTL: its lead spreads it). "+
		"The ideal counts neither.")
	for _, sys := range pgSystems {
		if e.cfg.keep(sys) {
			tdb.Row(sys)
		}
	}
	defer func() {
		for _, r := range t.Rows {
			tdb.Row(r.System).Skip = r.Skip
		}
	}()
	return e.seriesN(ctx, reps, t, pgSystems, func(ctx context.Context, r *Row, rep int) error {
		rdb := tdb.Row(r.System)
		key := e.key("pgmix")
		jobs := make([]Job, s.pgMixProcs)
		for i := range jobs {
			jobs[i] = Job{Kind: "pgmix", System: r.System, Addrs: []string{e.addr}, Goroutines: 16, Key: key,
				Keys: s.pgMixKeys, TTL: s.pgMixTTL, Duration: s.pgMixDur, Warmup: s.pgMixWarm,
				Rate: s.pgMixRate / float64(s.pgMixProcs), Seed: uint64(rep*1000 + i + 1),
				DSN: db.DSN(), Pool: s.pgPool, Deadline: s.pgDeadline,
				Trace: e.cfg.Trace != "" && strings.HasPrefix(r.System, "cacheguard")}
		}
		run, err := e.measuredPG(ctx, db, jobs)
		if err != nil {
			return err
		}
		if jobs[0].Trace {
			if err := e.writeTrace(r.System, rep, run.reps); err != nil {
				return err
			}
		}
		var t0 int64 = math.MaxInt64
		for _, rp := range run.reps {
			t0 = min(t0, rp.Start)
		}
		from, to := t0+int64(s.pgMixWarm), t0+int64(s.pgMixDur)
		var lat, age []time.Duration
		var keys []int32
		var sent, at []int64
		var spans []pgdb.Span
		var inWin [outOther + 1]int64
		var maxLag time.Duration
		ser := &Series{Bucket: s.pgBucket}
		nb := int((s.pgMixDur+s.pgDeadline)/s.pgBucket) + 1
		ser.Done, ser.Failed, ser.Qry = make([]int, nb), make([]int, nb), make([]int, nb)
		bucket := func(ns int64) int { return min(max(int((ns-t0)/int64(s.pgBucket)), 0), nb-1) }
		for _, rp := range run.reps {
			maxLag = max(maxLag, time.Duration(rp.PG.MaxLag))
			keys = append(keys, rp.ReqKey...)
			sent = append(sent, rp.ReqAt...)
			spans = append(spans, rp.PG.Spans...)
			for i, at := range rp.ReqAt {
				o, l := rp.PG.Out[i], rp.PG.LatAll[i]
				if o == outOK {
					ser.Done[bucket(at+l)]++
				} else {
					ser.Failed[bucket(at+l)]++
				}
				if at >= from && at < to {
					inWin[o]++
					lat = append(lat, time.Duration(l))
					if o == outOK {
						age = append(age, time.Duration(rp.PG.Age[i]))
					}
				}
			}
			for _, a := range rp.LoadAt {
				ser.Qry[bucket(a)]++
				if a >= from {
					at = append(at, a)
				}
			}
		}
		e.res.PGSeries[r.System] = ser // the last repetition's
		if maxLag > 100*time.Millisecond {
			e.cfg.logf("  %s: the request generator ran up to %v late", r.System, maxLag.Round(time.Millisecond))
		}
		c := sumPG(run.reps)
		d, a := stats.Durations(lat), stats.Durations(age)
		window := time.Duration(to - from).Seconds()
		r.add("rps", float64(inWin[outOK])/window)
		r.add("failed", float64(inWin[outPool]+inWin[outQuery]+inWin[outTimeout]+inWin[outOther]))
		r.add("pool", float64(inWin[outPool]))
		r.add("query", float64(inWin[outQuery]))
		r.add("p50", stats.Ms(d.P50))
		r.add("p99", stats.Ms(d.P99))
		r.add("max", stats.Ms(d.Max))
		if a.N > 0 {
			r.add("age99", a.P99.Seconds())
			r.add("agemax", a.Max.Seconds())
		}
		rdb.add("peak", float64(peakIn(at, 100*time.Millisecond)))
		rdb.add("loads", float64(c.sent))
		rdb.add("answered", float64(c.ok))
		rdb.add("pgcalls", float64(run.pg.Calls))
		rdb.add("cpu", run.pg.CPU.Seconds())
		rdb.add("cpuk", stats.Ms(run.pg.CPU)*1000/float64(max(c.out[outOK], 1)))
		// A query still running when the run ended (an early refresh begun in
		// its last moments) served no request of it: the ideal counts the
		// ones that returned.
		rdb.add("running", float64(max(c.sent-int64(len(spans)), 0)))
		rdb.add("ideal", float64(len(spans))/float64(max(idealLoads(keys, sent, s.pgMixTTL), 1)))
		ov, early := overlapping(spans, s.pgMixTTL)
		rdb.add("overlap", float64(ov))
		rdb.add("early", float64(early))
		return nil
	})
}

// overlapping counts the queries that started while another query for the
// same key was running, and the early ones: those that started after the
// key's previous queries had returned, but less than ttl after, while the
// value they returned could still have been fresh.
func overlapping(spans []pgdb.Span, ttl time.Duration) (overlap, early int) {
	slices.SortFunc(spans, func(a, b pgdb.Span) int {
		return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Start, b.Start))
	})
	var key, end int64 = -1, 0
	for _, s := range spans {
		if s.Key != key {
			key, end = s.Key, s.End
			continue
		}
		switch {
		case s.Start < end:
			overlap++
		case s.Start < end+int64(ttl):
			early++
		}
		end = max(end, s.End)
	}
	return overlap, early
}

// peakIn returns the most of the times (unix ns, any order) inside any window
// of length w.
func peakIn(at []int64, w time.Duration) int {
	at = slices.Clone(at)
	slices.Sort(at)
	peak, j := 0, 0
	for i := range at {
		for at[i]-at[j] >= int64(w) {
			j++
		}
		peak = max(peak, i-j+1)
	}
	return peak
}

// writeTrace writes the reports of one traced run into the trace directory.
func (e *env) writeTrace(system string, rep int, reps []Report) error {
	if err := os.MkdirAll(e.cfg.Trace, 0o755); err != nil {
		return err
	}
	name := strings.NewReplacer(" ", "-", "(", "", ")", "", "/", "-").Replace(system)
	p := filepath.Join(e.cfg.Trace, fmt.Sprintf("pgmix-%s-%s-rep%d.json", name, e.res.Started.Format("150405"), rep+1))
	b, err := json.Marshal(reps)
	if err != nil {
		return err
	}
	e.cfg.logf("  trace: %s", p)
	return os.WriteFile(p, b, 0o644)
}
