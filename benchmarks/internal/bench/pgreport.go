package bench

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

// summary returns the median and the worst (max) of metric key of system in
// table id; ok is false when there is no such data.
func (r *Results) summary(id, system, key string) (med, worst float64, ok bool) {
	r.read(id, system)
	t := r.Table(id)
	if t == nil {
		return math.NaN(), math.NaN(), false
	}
	for _, row := range t.Rows {
		if row.System == system && row.Skip == "" {
			if s, ok := row.Summary(key); ok {
				return s.Median, s.Max, true
			}
		}
	}
	return math.NaN(), math.NaN(), false
}

// pgTargets checks the goals of the real-database scenarios (issue 21).
func (r *Results) pgTargets() []Target {
	if r.Table("pg-mix") == nil && r.Table("pg-stampede") == nil {
		return nil
	}
	var out []Target
	add := func(what, goal, got string, ok, have bool) {
		st := status(ok)
		if !have {
			st, got = "n/a", "–"
		}
		out = append(out, Target{What: what, Goal: goal, Got: got, Status: st})
	}
	offered := r.s.pgMixRate
	_, _, okN := r.summary("pg-mix", systems.Naive, "failed")
	_, _, okS := r.summary("pg-mix", systems.Singleflight, "failed")
	for _, g := range []string{systems.Guard, systems.GuardSWR} {
		rps, _, ok1 := r.summary("pg-mix", g, "rps")
		_, gf, ok2 := r.summary("pg-mix", g, "failed")
		// The worst repetition of each: cacheguard's most failures, the
		// peers' fewest.
		nMin, sMin := r.minOf("pg-mix", systems.Naive, "failed"), r.minOf("pg-mix", systems.Singleflight, "failed")
		add(fmt.Sprintf("real DB mix: %s serves the offered %g/s with 0 failed requests (worst repetition) where naive and singleflight fail (their best repetition)", g, offered),
			"≥ 0.99× offered; 0 failed; naive, singleflight > 0",
			fmt.Sprintf("%.2f×; %.0f failed; naive %.0f, singleflight %.0f", rps/offered, gf, nMin, sMin),
			rps >= 0.99*offered && gf == 0 && nMin > 0 && sMin > 0, ok1 && ok2 && okN && okS)
	}
	for _, g := range []string{systems.Guard, systems.GuardSWR} {
		v, _, ok := r.summary("pg-mix-db", g, "ideal")
		add(fmt.Sprintf("real DB mix: %s loads ÷ ideal", g), "≤ 1.1", fmt.Sprintf("%.2f", v), v <= 1.1, ok)
	}
	nc, _, okc := r.summary("pg-mix-db", systems.Naive, "cpuk")
	for _, g := range []string{systems.Guard, systems.GuardSWR} {
		v, _, ok := r.summary("pg-mix-db", g, "cpuk")
		add(fmt.Sprintf("real DB mix: %s PostgreSQL CPU per completed request vs naive's", g), "≤ 0.5×",
			fmt.Sprintf("%.2f×", v/nc), v/nc <= 0.5, ok && okc)
	}
	sw, _, oks := r.summary("pg-mix-db", systems.GuardSWR, "cpuk")
	gw, _, okg := r.summary("pg-mix-db", systems.Guard, "cpuk")
	add(fmt.Sprintf("real DB mix: %s PostgreSQL CPU per completed request vs %s's (same work)", systems.Guard, systems.GuardSWR), "≤ 1.1×",
		fmt.Sprintf("%.2f×", gw/sw), gw/sw <= 1.1, oks && okg)
	if r.PG != nil && r.PG.Alone > 0 {
		alone := float64(r.PG.Alone) / 1e6
		for _, g := range []string{systems.Guard, systems.GuardSWR} {
			p, _, ok := r.summary("pg-mix", g, "p99")
			add(fmt.Sprintf("real DB mix: %s steady-state p99 vs the query alone (%.1f ms)", g, alone), "≤ 2×",
				fmt.Sprintf("%.2f× (%.0f ms)", p/alone, p), p/alone <= 2, ok)
		}
	}
	ov, _, oko := r.summary("pg-stampede-wake", systems.Guard, "over")
	sov, _, oks := r.summary("pg-stampede-wake", systems.Singleflight, "over")
	add("real DB stampede: cacheguard (wait, cold key) p99 minus the query's own time vs per-process singleflight's (table R1b)", "≤ 1.0×",
		ratioOrDash(overRatio(ov, sov))+fmt.Sprintf(" (%.1f vs %.1f ms)", ov, sov), ov <= sov, oko && oks)
	_, q, ok1 := r.summary("pg-stampede", systems.Guard, "loads")
	_, f, ok2 := r.summary("pg-stampede", systems.Guard, "failed")
	add("real DB stampede: cacheguard (wait) queries and failed requests (worst repetition)", "1 query; 0 failed",
		fmt.Sprintf("%.0f; %.0f", q, f), q == 1 && f == 0, ok1 && ok2)
	return out
}

// minOf returns the smallest value of metric key of system over repetitions.
func (r *Results) minOf(id, system, key string) float64 {
	r.read(id, system)
	t := r.Table(id)
	if t == nil {
		return math.NaN()
	}
	s, ok := t.Row(system).Summary(key)
	if !ok {
		return math.NaN()
	}
	return s.Min
}

// pgLead renders the opening section of RESULTS.md: the real-database
// results side by side.
func (r *Results) pgLead() string {
	mix, st := r.Table("pg-mix"), r.Table("pg-stampede")
	if r.PG == nil || (mix == nil && st == nil) {
		return ""
	}
	s := r.s
	var b strings.Builder
	b.WriteString("## Real database: does PostgreSQL stay standing?\n\n")
	sized := ""
	if r.PG.Share > 0 {
		sized = fmt.Sprintf(" (sized so that the query alone is %.0f%% of the host's %d CPUs' time when run once per key per TTL, "+
			"the mix's ideal: what a timing here depends on is then the same share of any host)", 100*r.PG.Share, r.PG.CPUs)
	}
	fmt.Fprintf(&b, "%s, started by the harness on loopback; one table of %d rows%s; the loader's query, an "+
		"aggregate over an unindexed column, takes %v alone; %d connections per process, each of which has run it once; every request has a %v "+
		"deadline. Hot-key mix (R2): %d processes offer %.0f requests/s, open loop, Zipf keys (%d) expiring %v after "+
		"each fill. Stampede (R1): %d processes × %d requests on one cold key. Medians over repetitions; *failed* is "+
		"the worst repetition.\n\n",
		r.PG.Version, r.PG.Rows, sized, r.PG.Alone.Round(100*time.Microsecond), r.PG.Pool, s.pgDeadline,
		s.pgMixProcs, s.pgMixRate, s.pgMixKeys, s.pgMixTTL, s.stampProcs, s.stampG)
	b.WriteString("| system | mix: completed/s | mix: failed | mix: PG CPU s | mix: PG CPU per completed request vs naive | " +
		"mix: loads ÷ ideal | mix: peak queries/100 ms | stampede: queries | stampede: failed | stampede: p99 ms |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	nc, _, _ := r.summary("pg-mix-db", systems.Naive, "cpuk")
	for _, sys := range pgSystems {
		if err := systems.Available(sys); err != nil {
			fmt.Fprintf(&b, "| %s | TODO: not merged yet | | | | | | | | |\n", sys)
			continue
		}
		cells := []string{sys}
		f := func(id, sys, key, format string, worst bool) string {
			m, w, ok := r.summary(id, sys, key)
			if !ok {
				return "–"
			}
			if worst {
				m = w
			}
			return fmt.Sprintf(format, m)
		}
		cells = append(cells,
			f("pg-mix", sys, "rps", "%.0f", false),
			f("pg-mix", sys, "failed", "%.0f", true),
			f("pg-mix-db", sys, "cpu", "%.1f", false))
		if c, _, ok := r.summary("pg-mix-db", sys, "cpuk"); ok && nc > 0 {
			cells = append(cells, fmt.Sprintf("%.2f×", c/nc))
		} else {
			cells = append(cells, "–")
		}
		cells = append(cells,
			f("pg-mix-db", sys, "ideal", "%.2f", false),
			f("pg-mix-db", sys, "peak", "%.0f", false))
		ssys := sys
		if sys == systems.GuardSWR {
			ssys = systems.GuardStale
		}
		cells = append(cells,
			f("pg-stampede", ssys, "loads", "%.0f", false),
			f("pg-stampede", ssys, "failed", "%.0f", true),
			f("pg-stampede", ssys, "p99", "%.0f", false))
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	b.WriteString("\nThe serve-stale row's stampede is on an expired key (a stale value is servable). Details, the " +
		"cross-check of query counts against PostgreSQL's own statistics, and the errors by cause: R1 and R2 below.\n\n")
	return b.String()
}
