package bench

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/pgdb"
	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// Target is one performance goal set by another issue, checked against the
// medians of this run.
type Target struct {
	What   string
	Goal   string
	Got    string
	Status string // PASS, FAIL, TODO (system not merged), n/a (scenario not run)
}

func status(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// targetRows are the rows of each table that the targets read (Targets,
// pgTargets): they run every repetition, the other rows fewer (see
// env.repsOf). A table of the warm scenario is listed without its key count.
var targetRows = map[string][]string{
	"pg-stampede":      {systems.Guard},
	"pg-stampede-wake": {systems.Guard},
	"pg-mix":           {systems.Naive, systems.Singleflight, systems.Guard, systems.GuardSWR},
	"pg-mix-db":        {systems.Naive, systems.Guard, systems.GuardSWR},
	"near-prop":        {nearIdle, nearLoaded},
	"uncontended":      {systems.Locks, systems.Redsync, systems.BSM, systems.RawSetNX},
	"names":            {systems.Locks},
	"handoff":          {systems.Locks},
	"contended":        {systems.Locks, systems.LocksFair, systems.RawSetNX},
	"redlock":          {systems.Redlock, systems.Redsync},
	"stampede":         {systems.Guard, systems.GuardStale, systems.Singleflight},
	"stampede-wake":    {systems.Guard},
	"warm":             {systems.Guard, systems.GuardHandOff, systems.GuardNear, systems.RawGetDecode},
}

// targetRow reports whether a target reads system's row of table id.
func targetRow(id, system string) bool {
	if base, n, ok := strings.Cut(id, "-"); ok && strings.Trim(n, "0123456789") == "" {
		id = base // warm-1, warm-1000
	}
	return slices.Contains(targetRows[id], system)
}

// Targets checks the goals the other issues set.
func (r *Results) Targets() []Target {
	var out []Target
	med := func(table, sys, key string) (float64, string) {
		r.read(table, sys)
		t := r.Table(table)
		if t == nil {
			return math.NaN(), "n/a"
		}
		if err := systems.Available(sys); err != nil {
			return math.NaN(), "TODO"
		}
		v, ok := t.Median(sys, key)
		if !ok {
			return math.NaN(), "n/a"
		}
		return v, ""
	}
	add := func(what, goal string, got float64, st string, ok bool, f string) {
		if st == "" && math.IsNaN(got) {
			st = "n/a"
		}
		if st == "" {
			st = status(ok)
		}
		g := "–"
		if !math.IsNaN(got) {
			g = fmt.Sprintf(f, got)
		}
		out = append(out, Target{What: what, Goal: goal, Got: g, Status: st})
	}
	worst := func(sts ...string) string {
		for _, s := range []string{"TODO", "n/a"} {
			for _, x := range sts {
				if x == s {
					return s
				}
			}
		}
		return ""
	}

	out = append(out, r.pgTargets()...)

	// Uncontended locks.
	lk, s1 := med("uncontended", systems.Locks, "ops")
	rs, s2 := med("uncontended", systems.Redsync, "ops")
	bs, s3 := med("uncontended", systems.BSM, "ops")
	raw, s4 := med("uncontended", systems.RawSetNX, "ops")
	best := math.Max(rs, bs)
	add("locks uncontended vs fastest go-redis peer (redsync, bsm/redislock)", "≥ 1.0×", lk/best, worst(s1, s2, s3), lk/best >= 1.0, "%.2f×")
	add("locks uncontended vs raw SET NX PX + EVALSHA", "≥ 0.95×", lk/raw, worst(s1, s4), lk/raw >= 0.95, "%.2f×")
	al, s5 := med("uncontended", systems.Locks, "allocs")
	add("locks allocations per cycle", "≤ 30", al, s5, al <= 30, "%.1f")

	// Many hot names.
	nr, sn := med("names", systems.Locks, "ratio")
	add(fmt.Sprintf("locks uncontended over %d hot names vs %d names (same repetition)", r.s.manyNames, r.s.cycleG), "≥ 0.9×", nr, sn, nr >= 0.9, "%.2f×")

	// Hand-off with many local waiters.
	if len(r.s.handWaiters) > 1 {
		lo, hi := r.s.handWaiters[0], r.s.handWaiters[len(r.s.handWaiters)-1]
		for _, q := range []string{"50", "99"} {
			v, st := med("handoff", systems.Locks, "r"+q)
			add(fmt.Sprintf("hand-off p%s with %d local waiters on one name vs %d (default mode, same repetition)", q, hi, lo), "≤ 1.25×",
				v, st, v <= 1.25, "%.2f×")
		}
	}

	// Contended, default mode.
	u, su := med("contended", systems.Locks, "util")
	add("contended default: share of time held", "≥ 0.85", u, su, u >= 0.85, "%.3f")
	p, sp := med("contended", systems.Locks, "p99")
	add("contended default: p99 wait", "≤ 150 ms", p, sp, p <= 150, "%.1f ms")
	q, sq := med("contended", systems.Locks, "reqs")
	add("contended default: client requests per acquisition", "≤ 4", q, sq, q <= 4, "%.2f")
	c, sc := med("contended", systems.Locks, "cpu")
	add("contended default: Redis CPU per acquisition", "≤ 150 µs", c, sc, c <= 150, "%.0f µs")
	rc, src := med("contended", systems.RawSetNX, "cpu")
	add("contended default: Redis CPU per acquisition vs the raw SET NX PX + EVALSHA loop", "≤ 0.5×", c/rc, worst(sc, src), c/rc <= 0.5, "%.2f×")

	// Contended, fair mode.
	bound := 2 * float64(r.s.contProcs*r.s.contG) * float64(r.s.hold) / float64(time.Millisecond)
	p, sp = med("contended", systems.LocksFair, "p99")
	add(fmt.Sprintf("contended fair: p99 wait (2 × %d contenders × %v)", r.s.contProcs*r.s.contG, r.s.hold),
		fmt.Sprintf("≤ %.0f ms", bound), p, sp, p <= bound, "%.1f ms")
	u, su = med("contended", systems.LocksFair, "util")
	add("contended fair: share of time held", "≥ 0.9", u, su, u >= 0.9, "%.3f")
	q, sq = med("contended", systems.LocksFair, "reqs")
	add("contended fair: client requests per acquisition", "≤ 3", q, sq, q <= 3, "%.2f")

	// Stampede.
	var maxLoads float64 = math.NaN()
	sl := "n/a"
	if t := r.Table("stampede"); t != nil {
		sl = ""
		if err := systems.Available(systems.Guard); err != nil {
			sl = "TODO"
		} else if s, ok := t.Row(systems.Guard).Summary("loads"); ok {
			maxLoads = s.Max
		}
	}
	add("stampede: cacheguard loads (worst repetition)", "= 1", maxLoads, sl, maxLoads == 1, "%.0f")
	ov, s6 := med("stampede-wake", systems.Guard, "over")
	add("stampede: cacheguard (wait, cold key) p99 minus the load's own time (table 4b)", "≤ 5 ms", ov, s6, ov <= 5, "%.1f ms")
	sf, s7 := med("stampede", systems.Singleflight, "p99")
	sp2, s12 := med("stampede", systems.GuardStale, "p99")
	add("stampede: cacheguard (serve-stale, expired key) p99 vs per-process singleflight p99", "≤ 0.75×", sp2/sf, worst(s12, s7), sp2/sf <= 0.75, "%.2f×")

	// Warm hits.
	for _, id := range []string{"warm-1", fmt.Sprintf("warm-%d", r.s.warmKeys)} {
		g, s8 := med(id, systems.Guard, "ops")
		w, s9 := med(id, systems.RawGetDecode, "ops")
		add("warm hit ("+strings.TrimPrefix(id, "warm-")+" keys): cacheguard.Get vs raw GET + decode", "≥ 0.9×", g/w, worst(s8, s9), g/w >= 0.9, "%.2f×")
		nc, s15 := med(id, systems.GuardNear, "ops")
		add("warm hit ("+strings.TrimPrefix(id, "warm-")+" keys), near cache: cacheguard.Get vs raw GET + decode", "≥ 50×", nc/w, worst(s15, s9), nc/w >= 50, "%.1f×")
		na, _ := med(id, systems.GuardNear, "allocs")
		add("warm hit ("+strings.TrimPrefix(id, "warm-")+" keys), near cache: allocations per read", "0", na, worst(s15), na < 0.5, "%.2f")
		h, s14 := med(id, systems.GuardHandOff, "ops")
		add("warm hit ("+strings.TrimPrefix(id, "warm-")+" keys), client without ContextTimeoutEnabled (hand-off): cacheguard.Get vs raw GET + decode", "≥ 0.9×", h/w, worst(s14, s9), h/w >= 0.9, "%.2f×")
	}

	// GetMany against as many Gets in a row (the micro-benchmarks).
	many, okM := microMedian(r.Micro, "BenchmarkWarmGetMany/small/many")
	seq, okS := microMedian(r.Micro, "BenchmarkWarmGetMany/small/sequential")
	st := ""
	if !okM || !okS {
		st = "n/a"
	}
	add("GetMany of 100 warm keys vs 100 Gets in a row (micro-benchmark, small record)", "≥ 20×", seq/many, st, seq/many >= 20, "%.1f×")

	// Near-cache propagation.
	for _, row := range []string{nearIdle, nearLoaded} {
		v, ok := r.nearMedian(row, "p99")
		m, _ := r.nearMedian(row, "missed")
		st := ""
		if !ok {
			st = "n/a"
		}
		add(fmt.Sprintf("near-cache invalidation seen by all %d other processes, lag p99: %s", nearWatchers,
			strings.TrimPrefix(row, "cacheguard (near cache), ")), "≤ 5 ms; 0 missed rounds", v, st, v <= 5 && m == 0, "%.2f ms")
		if ok && m > 0 {
			out[len(out)-1].Got += fmt.Sprintf("; %.0f missed", m)
		}
	}

	// Redlock.
	rl, s10 := med("redlock", systems.Redlock, "ops")
	rd, s11 := med("redlock", systems.Redsync, "ops")
	add("Redlock over 5 servers vs redsync over the same 5", "≥ 1.0×", rl/rd, worst(s10, s11), rl/rd >= 1.0, "%.2f×")
	return out
}

// nearMedian returns the median of metric key of a row of the near-cache
// propagation table (ok false when it did not run).
func (r *Results) nearMedian(row, key string) (float64, bool) {
	r.read("near-prop", row)
	t := r.Table("near-prop")
	if t == nil {
		return math.NaN(), false
	}
	rw := t.Row(row)
	s, ok := rw.Summary(key)
	if rw.Skip != "" || !ok {
		return math.NaN(), false
	}
	return s.Median, true
}

// Markdown renders RESULTS.md.
func (r *Results) Markdown(m Machine, command string, charts []string, outDir string) string {
	var b strings.Builder
	b.WriteString("# cacheguard benchmark results\n\n")
	b.WriteString("Generated by `cgbench` (benchmarks/cmd/cgbench); do not edit by hand. ")
	b.WriteString("Every scenario runs every system in the same run, interleaved (each repetition runs all systems once, " +
		"the starting system rotating), each run in worker processes that served earlier runs (a system is new in every " +
		"run; the processes, warmed, and their database pools outlive it, as a service's do). Cells are the **median over repetitions " +
		"(min–max)**.\n\n")
	fmt.Fprintf(&b, "- Command: `%s`\n", command)
	fmt.Fprintf(&b, "- Date: %s; took %v; %d repetitions", r.Started.UTC().Format(time.RFC3339), r.Took.Round(time.Second), r.Reps)
	if r.Few < r.Reps {
		fmt.Fprintf(&b, " of each row a target reads, %d of the others (a scenario's own cap, where it states one, applies to both)", r.Few)
	}
	if r.Quick {
		b.WriteString(" (**quick mode: tiny sizes, the numbers mean nothing**)")
	}
	b.WriteString("\n")
	if len(r.Steps) > 0 {
		steps := make([]string, len(r.Steps))
		for i, st := range r.Steps {
			steps[i] = fmt.Sprintf("%s %v", st.Name, st.Took.Round(time.Second))
		}
		fmt.Fprintf(&b, "- Scenarios took: %s\n", strings.Join(steps, ", "))
	}
	fmt.Fprintf(&b, "- Machine: %d CPUs, %s; %s; load average at start %s\n", m.CPUs, m.CPUModel, m.Kernel, m.LoadAvg)
	when := "at the start"
	if m.Busy {
		when = "at the start, before the busy loop below"
	}
	fmt.Fprintf(&b, "- Host costs, measured %s: %s\n", when, m.Costs)
	if m.Busy {
		b.WriteString("- **Beside a busy loop**: one CPU was kept busy by a spinning thread for the whole run (`cgbench -busy`), " +
			"as on a loaded machine.\n")
	}
	fmt.Fprintf(&b, "- Go: %s; Redis: %s (started by the harness, persistence off, on loopback)\n", m.Go, m.Redis)
	if r.PG != nil {
		fmt.Fprintf(&b, "- PostgreSQL: %s (started by the harness on loopback, a new cluster per run; settings beyond the defaults: "+
			"fsync off, %s)\n", r.PG.Version, strings.Join(pgdb.Settings, ", "))
	}
	b.WriteString("- The machine was shared with other work during the run: read ratios within one table, not absolute numbers.\n\n")

	// The real database leads, with its charts.
	var rest []string
	lead := r.pgLead()
	for _, c := range charts {
		rel, err := filepath.Rel(outDir, c)
		if err != nil {
			rel = c
		}
		name := strings.TrimSuffix(filepath.Base(c), ".png")
		img := fmt.Sprintf("![%s](%s)\n\n", name, filepath.ToSlash(rel))
		if lead != "" && strings.HasPrefix(name, "pg-") {
			lead += img
		} else {
			rest = append(rest, img)
		}
	}
	b.WriteString(lead)

	b.WriteString("## Targets\n\n| goal | target | measured | status |\n|---|---|---:|---|\n")
	for _, t := range r.Targets() {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.What, t.Goal, t.Got, t.Status)
	}
	b.WriteString("\nTODO: the system's code is not merged into the benchmark branch yet; n/a: the scenario was not run.\n\n")
	for _, n := range r.Notes {
		b.WriteString("> " + n + "\n\n")
	}
	if len(rest) > 0 {
		b.WriteString("## Charts\n\n")
		for _, img := range rest {
			b.WriteString(img)
		}
	}
	b.WriteString("## Scenarios\n\n")
	for _, t := range r.Tables {
		b.WriteString(t.Markdown())
	}
	if r.Micro != "" {
		fmt.Fprintf(&b, "## 7. Go micro-benchmarks\n\n`go test -bench` in benchmarks/micro, %d runs of each, each a fixed "+
			"number of iterations (-benchtime %s; for BenchmarkWarmGetMany, 100 keys an iteration, %s of its GetMany "+
			"and %s of its 100 Gets in a row, one run of each in turn) (benchstat-friendly; saved as results/micro.txt):\n\n```\n",
			r.s.microCount, r.s.microIters, r.s.microIterBatch, r.s.microIterMany)
		b.WriteString(r.Micro)
		b.WriteString("\n```\n")
	}
	return b.String()
}

// microMedian returns the median ns/op of the micro-benchmark name (without
// its -GOMAXPROCS suffix) over the runs in out, go test -bench output.
func microMedian(out, name string) (float64, bool) {
	var ns []float64
	for line := range strings.SplitSeq(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 4 || f[3] != "ns/op" {
			continue
		}
		if n, _, ok := strings.Cut(f[0], "-"); !ok || n != name {
			continue
		}
		if v, err := strconv.ParseFloat(f[2], 64); err == nil {
			ns = append(ns, v)
		}
	}
	return stats.Summarise(ns).Median, len(ns) > 0
}
