package bench

import (
	"cmp"
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
	"pg-stampede":        {systems.Guard},
	"pg-stampede-wake":   {systems.Guard, systems.Singleflight},
	"pg-mix":             {systems.Naive, systems.Singleflight, systems.Guard, systems.GuardSWR},
	"pg-mix-db":          {systems.Naive, systems.Guard, systems.GuardSWR},
	"near-prop":          {nearIdle, nearLoaded},
	"uncontended":        {systems.Locks, systems.LocksScripts, systems.Redsync, systems.BSM, systems.RawSetNX},
	"lone-cycle":         {systems.Locks, systems.LocksScripts, systems.RawSetNX},
	"lone-cycle-request": {systems.Locks, systems.RawSetNX},
	"lone-hit":           {systems.Guard, systems.GuardHandOff, systems.GuardTimeouts, systems.RawGetDecode},
	"names":              {systems.Locks, systems.RawSetNX},
	"handoff":            {systems.Locks},
	"contended":          {systems.Locks, systems.LocksFair, systems.RawSetNX, systems.Redsync, systems.BSM, systems.Rueidislock},
	"redlock":            {systems.Redlock, systems.Redsync},
	"stampede":           {systems.Guard, systems.GuardStale, systems.Singleflight},
	"stampede-wake":      {systems.Guard, systems.Singleflight},
	"warm":               {systems.Guard, systems.GuardHandOff, systems.GuardTimeouts, systems.GuardNear, systems.RawGetDecode, systems.GoRedisGet},
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
	// What a call asks of the kernel, whatever the host charges for it
	// (issue 49): no more context switches than the raw loop's.
	for _, id := range []string{"uncontended", "lone-cycle"} {
		lc, sa := med(id, systems.Locks, "csw")
		rc, sb := med(id, systems.RawSetNX, "csw")
		g := fmt.Sprintf("%d goroutines", r.s.cycleG)
		if id == "lone-cycle" {
			g = "one goroutine"
		}
		add(fmt.Sprintf("locks uncontended (%s): context switches per cycle vs the raw loop's", g), "≤ 1.0×", lc/rc, worst(sa, sb), lc <= rc, "%.2f×")
		if id == "lone-cycle" {
			out[len(out)-1].Got += fmt.Sprintf(" (%.2f vs %.2f)", lc, rc)
		}
		// What the cycle asks of Redis (a count, whatever the host): a
		// longer cycle spends more of the runtime's own wake-ups.
		if lm, _ := med(id, systems.Locks, "rcmds"); !math.IsNaN(lm) {
			rm, _ := med(id, systems.RawSetNX, "rcmds")
			out[len(out)-1].Got += fmt.Sprintf("; Redis commands/cycle %.0f vs %.0f", lm, rm)
		}
	}
	// Who wakes a call's goroutine (issue 49's "hands nothing to another
	// goroutine"), counted from the execution trace: the same on any host,
	// where context switches also count the runtime's own threads (see
	// wakes). One goroutine: none, as the raw loop. Sixteen: each call
	// queued behind a send is handed its reply by the caller that sent the
	// batch (a wake-up it would have had from its own reply): information.
	for _, id := range []string{"uncontended", "lone-cycle"} {
		lh, sa := med(id, systems.Locks, "hand")
		rh, sb := med(id, systems.RawSetNX, "hand")
		if id == "uncontended" {
			add(fmt.Sprintf("locks uncontended (%d goroutines): hand-offs per cycle (execution trace; batching's by design: information)", r.s.cycleG),
				"–", lh, cmp.Or(worst(sa, sb), "info"), true, "%.3f")
		} else {
			add("locks uncontended (one goroutine): hand-offs per cycle (execution trace: a goroutine woken or started by another)", "≤ 0.01", lh, worst(sa, sb), lh <= 0.01, "%.3f")
		}
		out[len(out)-1].Got += fmt.Sprintf(" (raw loop %.3f)", rh)
	}
	// What the lock's machinery adds to its own two scripts: the same
	// command lines sent raw, each on its caller's goroutine (the control
	// of tables 1 and 1c). Within 5%: both are counts of one process over
	// a few thousand cycles. (With 16 goroutines the raw loop's count is
	// lower than the scripts' own: a switch there is a thread going idle,
	// and a cycle whose commands keep Redis busier longer leaves the
	// client's threads idle more often — not a hand-off of ours.)
	for _, id := range []string{"uncontended", "lone-cycle"} {
		ls, ss := med(id, systems.LocksScripts, "csw")
		if math.IsNaN(ls) {
			continue
		}
		lc, sa := med(id, systems.Locks, "csw")
		g := fmt.Sprintf("%d goroutines", r.s.cycleG)
		if id == "lone-cycle" {
			g = "one goroutine"
		}
		add(fmt.Sprintf("locks uncontended (%s): context switches per cycle vs its own two scripts sent raw (what the lock adds to them)", g), "≤ 1.05×", lc/ls, worst(sa, ss), lc <= 1.05*ls, "%.2f×")
		out[len(out)-1].Got += fmt.Sprintf(" (%.2f vs %.2f)", lc, ls)
	}

	// A request's context (cancellable) costs a lock cycle nothing more
	// than context.Background does (the direct call shares a deadline).
	lq, sq := med("lone-cycle-request", systems.Locks, "ratio")
	rq, _ := med("lone-cycle-request", systems.RawSetNX, "ratio")
	add("locks uncontended (one goroutine): cycles/s under a request's context vs under context.Background, same repetition (table 1d)", "≥ 0.95×", lq, sq, lq >= 0.95, "%.2f×")
	out[len(out)-1].Got += fmt.Sprintf("; raw loop %.2f×", rq)

	// Many hot names.
	nr, sn := med("names", systems.Locks, "ratio")
	add(fmt.Sprintf("locks uncontended over %d hot names vs %d names (same repetition)", r.s.manyNames, r.s.cycleG), "≥ 0.9×", nr, sn, nr >= 0.9, "%.2f×")
	// What the timing depends on, in counts: CPU per cycle, client and Redis.
	if cf, _ := med("names", systems.Locks, "cfew"); cf > 0 {
		cm, _ := med("names", systems.Locks, "cmany")
		rf, _ := med("names", systems.Locks, "rfew")
		rm, _ := med("names", systems.Locks, "rmany")
		rr, _ := med("names", systems.RawSetNX, "ratio")
		out[len(out)-1].Got += fmt.Sprintf("; CPU/cycle client %.2f×, Redis %.2f×; raw loop %.2f×", cm/cf, rm/rf, rr)
	}

	// Hand-off with many local waiters.
	if len(r.s.handWaiters) > 1 {
		lo, hi := r.s.handWaiters[0], r.s.handWaiters[len(r.s.handWaiters)-1]
		for _, q := range []string{"50", "99"} {
			v, st := med("handoff", systems.Locks, "r"+q)
			add(fmt.Sprintf("hand-off p%s with %d local waiters on one name vs %d (default mode, same repetition)", q, hi, lo), "≤ 1.25×",
				v, st, v <= 1.25, "%.2f×")
		}
	}

	// Contended, default mode: ratios to the raw loop and the peers of the
	// same run (issue 48); the absolute figures are in table 2.
	u, su := med("contended", systems.Locks, "util")
	ru, sru := med("contended", systems.RawSetNX, "util")
	add("contended default: share of time held vs the raw SET NX PX loop's (the host's own ceiling)", "≥ 1.0×", u/ru, worst(su, sru), u >= ru, "%.3f×")
	// A holding is the holder's 1 ms sleep, as late as its process's other
	// work (pollers) makes the timer: a system whose waiters poll lengthens
	// its own holdings, and so its held share, at the same throughput.
	hl, _ := med("contended", systems.Locks, "hold")
	hr, _ := med("contended", systems.RawSetNX, "hold")
	out[len(out)-1].Got += fmt.Sprintf(" (mean holding %.0f vs %.0f µs)", hl, hr)
	a, sa := med("contended", systems.Locks, "acqs")
	ra, sra := med("contended", systems.RawSetNX, "acqs")
	add("contended default: acquisitions/s vs the raw SET NX PX loop's (same nominal hold)", "≥ 1.0×", a/ra, worst(sa, sra), a >= ra, "%.2f×")
	p, sp := med("contended", systems.Locks, "p99")
	peerP99, speer := math.NaN(), ""
	for _, peer := range []string{systems.Redsync, systems.BSM, systems.Rueidislock, systems.RawSetNX} {
		v, st := med("contended", peer, "p99")
		speer = worst(speer, st)
		if !math.IsNaN(v) && (math.IsNaN(peerP99) || v < peerP99) {
			peerP99 = v
		}
	}
	add("contended default: p99 wait vs the best peer's (redsync, bsm/redislock, rueidislock, raw loop)", "≤ 0.25×", p/peerP99, worst(sp, speer), p/peerP99 <= 0.25, "%.2f×")
	q, sq := med("contended", systems.Locks, "reqs")
	add("contended default: client requests per acquisition", "≤ 1.1", q, sq, q <= 1.1, "%.2f")
	c, sc := med("contended", systems.Locks, "cpu")
	rc, src := med("contended", systems.RawSetNX, "cpu")
	add("contended default: Redis CPU per acquisition vs the raw SET NX PX + EVALSHA loop", "≤ 0.5×", c/rc, worst(sc, src), c/rc <= 0.5, "%.2f×")

	// Contended, fair mode.
	bound := 2 * float64(r.s.contProcs*r.s.contG) * float64(r.s.hold) / float64(time.Millisecond)
	p, sp = med("contended", systems.LocksFair, "p99")
	add(fmt.Sprintf("contended fair: p99 wait (2 × %d contenders × %v)", r.s.contProcs*r.s.contG, r.s.hold),
		fmt.Sprintf("≤ %.0f ms", bound), p, sp, p <= bound, "%.1f ms")
	u, su = med("contended", systems.LocksFair, "util")
	add("contended fair: share of time held vs the raw SET NX PX loop's", "≥ 0.95×", u/ru, worst(su, sru), u/ru >= 0.95, "%.3f×")
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
	sov, s16 := med("stampede-wake", systems.Singleflight, "over")
	cst := worst(s6, s16)
	if cst == "" && !math.IsNaN(ov) && sov <= 0 {
		cst = status(ov <= sov) // no ratio (see overRatio): the figures decide
	}
	add("stampede: cacheguard (wait, cold key) p99 minus the load's own time vs per-process singleflight's (table 4b)", "≤ 1.0×",
		overRatio(ov, sov), cst, ov <= sov, "%.2f×")
	out[len(out)-1].Got += fmt.Sprintf(" (%.1f vs %.1f ms)", ov, sov)
	if gc, _ := med("stampede", systems.Guard, "ccpu"); !math.IsNaN(gc) {
		sc, _ := med("stampede", systems.Singleflight, "ccpu")
		out[len(out)-1].Got += fmt.Sprintf("; client CPU/request %.0f vs %.0f µs", gc, sc)
	}
	sf, s7 := med("stampede", systems.Singleflight, "p99")
	sp2, s12 := med("stampede", systems.GuardStale, "p99")
	add("stampede: cacheguard (serve-stale, expired key) p99 vs per-process singleflight p99", "≤ 0.75×", sp2/sf, worst(s12, s7), sp2/sf <= 0.75, "%.2f×")

	// Warm hits.
	for _, id := range []string{"warm-1", fmt.Sprintf("warm-%d", r.s.warmKeys)} {
		keys := strings.TrimPrefix(id, "warm-")
		g, s8 := med(id, systems.Guard, "ops")
		w, s9 := med(id, systems.RawGetDecode, "ops")
		add("warm hit ("+keys+" keys): cacheguard.Get vs raw GET + decode", "≥ 0.9×", g/w, worst(s8, s9), g/w >= 0.9, "%.2f×")
		if keys != "1" {
			gr, s17 := med(id, systems.GoRedisGet, "ops")
			add("warm hit ("+keys+" keys): cacheguard.Get vs go-redis/cache Get (the peer doing the same work)", "≥ 0.95×", g/gr, worst(s8, s17), g/gr >= 0.95, "%.2f×")
		}
		nc, s15 := med(id, systems.GuardNear, "ops")
		add("warm hit ("+keys+" keys), near cache: cacheguard.Get vs raw GET + decode", "≥ 50×", nc/w, worst(s15, s9), nc/w >= 50, "%.1f×")
		na, _ := med(id, systems.GuardNear, "allocs")
		add("warm hit ("+keys+" keys), near cache: allocations per read", "0", na, worst(s15), na < 0.5, "%.2f")
		h, s14 := med(id, systems.GuardHandOff, "ops")
		add("warm hit ("+keys+" keys), client without ContextTimeoutEnabled (hand-off): cacheguard.Get vs raw GET + decode", "≥ 0.9×", h/w, worst(s14, s9), h/w >= 0.9, "%.2f×")
	}
	// What a hit asks of the kernel (issue 49).
	for _, id := range []string{fmt.Sprintf("warm-%d", r.s.warmKeys), "lone-hit"} {
		g := fmt.Sprintf("%d goroutines", r.s.warmG)
		if id == "lone-hit" {
			g = "one goroutine"
		}
		rw, sr := med(id, systems.RawGetDecode, "csw")
		// A client without ContextTimeoutEnabled reads on the caller's
		// goroutine when one attempt's own bound (its Read+WriteTimeout)
		// fits the call's: the 400 ms row. With go-redis's defaults (5 s
		// each way, up to 4 attempts) no attempt fits a call's bound (the
		// command timeout, the 10 s wait budget), so the read is detached
		// by design, as issue 49 allows where "the caller's deadline is
		// shorter than the command's bound": information, not a target.
		for _, sys := range []string{systems.Guard, systems.GuardTimeouts, systems.GuardHandOff} {
			v, st := med(id, sys, "csw")
			what, goal, status := "cacheguard.Get", "≤ 1.0×", worst(st, sr)
			switch sys {
			case systems.GuardTimeouts:
				what += ", client without ContextTimeoutEnabled, Read/WriteTimeout 400 ms (fits the call's bound)"
			case systems.GuardHandOff:
				what += ", client without ContextTimeoutEnabled, go-redis's default timeouts (the read detached: information)"
				goal = "–"
				if status == "" {
					status = "info"
				}
			}
			add(fmt.Sprintf("warm hit (%d keys, %s), %s: context switches per read vs raw GET + decode's", r.s.warmKeys, g, what),
				goal, v/rw, status, v <= rw, "%.2f×")
			if id == "lone-hit" {
				out[len(out)-1].Got += fmt.Sprintf(" (%.2f vs %.2f)", v, rw)
			}
		}
	}

	// Who wakes a hit's goroutine (see the locks' rows above): with 16
	// goroutines, concurrent hits share round trips as lock calls do, and
	// a hit queued behind them is handed its reply: information.
	for _, id := range []string{fmt.Sprintf("warm-%d", r.s.warmKeys), "lone-hit"} {
		g := fmt.Sprintf("%d goroutines", r.s.warmG)
		goal, info := "–", "info"
		if id == "lone-hit" {
			g, goal, info = "one goroutine", "≤ 0.01", ""
		}
		rh, sr := med(id, systems.RawGetDecode, "hand")
		for _, sys := range []string{systems.Guard, systems.GuardTimeouts} {
			v, st := med(id, sys, "hand")
			what := "cacheguard.Get"
			if sys == systems.GuardTimeouts {
				what += ", client without ContextTimeoutEnabled, Read/WriteTimeout 400 ms"
			}
			if info != "" {
				what += " (reads shared by design: information)"
			}
			add(fmt.Sprintf("warm hit (%d keys, %s), %s: hand-offs per read (execution trace)", r.s.warmKeys, g, what),
				goal, v, cmp.Or(worst(st, sr), info), v <= 0.01, "%.3f")
			out[len(out)-1].Got += fmt.Sprintf(" (raw GET + decode %.3f)", rh)
		}
	}

	// GetMany against as many Gets in a row (the micro-benchmarks).
	many, okM := microMedian(r.Micro, "BenchmarkWarmGetMany/small/many")
	seq, okS := microMedian(r.Micro, "BenchmarkWarmGetMany/small/sequential")
	st := ""
	if !okM || !okS {
		st = "n/a"
	}
	add("GetMany of 100 warm keys vs 100 Gets in a row (micro-benchmark, small record)", "≥ 20×", seq/many, st, seq/many >= 20, "%.1f×")

	// The default codec's decode against encoding/json's, same run: a cost
	// some hosts add (segmentio/asm's AVX→SSE transitions) shows as a ratio.
	for _, v := range []string{"small", "repo"} {
		cg, okC := microMedian(r.Micro, "BenchmarkDecode/"+v+"/cacheguard")
		sj, okJ := microMedian(r.Micro, "BenchmarkDecode/"+v+"/std")
		st := ""
		if !okC || !okJ {
			st = "n/a"
		}
		add(fmt.Sprintf("JSON decode (%s value): encoding/json's time vs the default codec's (micro-benchmark)", v), "≥ 2×", sj/cg, st, sj/cg >= 2, "%.1f×")
	}

	// Near-cache propagation, against a bare PUBLISH→receive on the same
	// Redis in the same run (the floor on a busy host; issue 48).
	// The propagation is the old value dropped; serving the new one also
	// takes a reload, which no PUBLISH has (table 8 shows both). Both p99s
	// are of every repetition's rounds (probes) together: one repetition's
	// is its second-largest.
	for _, row := range []string{nearIdle, nearLoaded} {
		v, ok := r.nearSummary(row, "drop99all")
		m, _ := r.nearSummary(row, "missed")
		pb, okp := r.nearSummary(row, "floor99all")
		st := ""
		if !ok || !okp {
			st = "n/a"
		}
		add(fmt.Sprintf("near-cache invalidation propagated to all %d other processes (old value dropped), p99 vs a bare PUBLISH→receive by the same processes: %s", nearWatchers,
			strings.TrimPrefix(row, "cacheguard (near cache), ")), "≤ 2×; 0 missed rounds", v.Median/pb.Median, st, v.Median <= 2*pb.Median && m.Max == 0, "%.2f×")
		if ok && okp {
			out[len(out)-1].Got += fmt.Sprintf(" (%.2f vs %.2f ms)", v.Median, pb.Median)
		}
		if ok && m.Max > 0 {
			out[len(out)-1].Got += fmt.Sprintf("; %.0f missed in a repetition", m.Max)
		}
	}

	// Redlock.
	rl, s10 := med("redlock", systems.Redlock, "ops")
	rd, s11 := med("redlock", systems.Redsync, "ops")
	add("Redlock over 5 servers vs redsync over the same 5", "≥ 1.0×", rl/rd, worst(s10, s11), rl/rd >= 1.0, "%.2f×")
	return out
}

// nearSummary returns metric key of a row of the near-cache propagation
// table over repetitions (ok false when it did not run).
func (r *Results) nearSummary(row, key string) (stats.Summary, bool) {
	r.read("near-prop", row)
	nan := stats.Summary{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	t := r.Table("near-prop")
	if t == nil {
		return nan, false
	}
	rw := t.Row(row)
	s, ok := rw.Summary(key)
	if rw.Skip != "" || !ok {
		return nan, false
	}
	return s, true
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
