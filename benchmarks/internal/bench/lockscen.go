package bench

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/cacheguard/cacheguard/benchmarks/internal/redisproc"
	"github.com/cacheguard/cacheguard/benchmarks/internal/stats"
	"github.com/cacheguard/cacheguard/benchmarks/internal/systems"
)

var cycleMetrics = []Metric{
	{"ops", "cycles/s", "%.0f"},
	{"p50", "p50 µs", "%.0f"},
	{"p99", "p99 µs", "%.0f"},
	{"allocs", "allocs/cycle", "%.1f"},
	{"reqs", "requests/cycle", "%.2f"},
}

// cycleRun records one uncontended run (lock then unlock, every goroutine on
// its own name) of one system.
func (e *env) cycleRun(ctx context.Context, r *Row, addrs []string, g int, d time.Duration) error {
	reps, _, _, err := e.measured(ctx, []Job{{Kind: "cycle", System: r.System, Addrs: addrs,
		Goroutines: g, Duration: d, Key: e.key("cycle")}})
	if err != nil {
		return err
	}
	rep := reps[0]
	lat := make([]time.Duration, len(rep.Lat))
	for i, v := range rep.Lat {
		lat[i] = time.Duration(v)
	}
	dist := stats.Durations(lat)
	ops := float64(rep.Ops)
	r.add("ops", ops/time.Duration(rep.Elapsed).Seconds())
	r.add("p50", float64(dist.P50)/1e3)
	r.add("p99", float64(dist.P99)/1e3)
	r.add("allocs", float64(rep.Mallocs)/max(ops, 1))
	r.add("reqs", float64(rep.Requests)/max(ops, 1))
	return firstErr(reps)
}

var lockPeers = []string{systems.Redsync, systems.BSM, systems.Rueidislock, systems.RawSetNX}

func (e *env) uncontended(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "uncontended", Title: "1. Uncontended lock cycle",
		Intro: fmt.Sprintf("One process, %d goroutines, each locking and unlocking its own name for %v per run "+
			"(Lock + Unlock, the blocking API of each library). Allocations are the process's heap allocations "+
			"per cycle (runtime.MemStats), background work included; requests are the commands the process sent.",
			s.cycleG, s.cycleDur),
		Metrics: cycleMetrics}
	e.res.Tables = append(e.res.Tables, t)
	return e.series(ctx, t, append([]string{systems.Locks}, lockPeers...), func(ctx context.Context, r *Row, _ int) error {
		return e.cycleRun(ctx, r, []string{e.addr}, s.cycleG, s.cycleDur)
	})
}

func (e *env) redlock(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "redlock", Title: "3. Redlock over 5 independent servers",
		Intro: fmt.Sprintf("Five local redis-server processes; one process, %d goroutines, uncontended lock cycles "+
			"for %v per run, as in scenario 1.", s.cycleG, s.cycleDur),
		Metrics: cycleMetrics}
	e.res.Tables = append(e.res.Tables, t)
	srvs, err := redisproc.StartN(5)
	if err != nil {
		e.res.Notes = append(e.res.Notes, "redlock scenario skipped: "+err.Error())
		return nil
	}
	defer func() {
		for _, v := range srvs {
			v.Close()
		}
	}()
	addrs := make([]string, len(srvs))
	for i, v := range srvs {
		addrs[i] = v.Addr()
	}
	return e.series(ctx, t, []string{systems.Redlock, systems.Redsync}, func(ctx context.Context, r *Row, _ int) error {
		return e.cycleRun(ctx, r, addrs, s.cycleG, s.cycleDur)
	})
}

func (e *env) contended(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "contended", Title: "2. Contended lock",
		Intro: fmt.Sprintf("%d OS processes × %d goroutines take one lock name in a loop for %v per run and hold it "+
			"%v. *Held* is the share of the run during which some caller held the lock; *wait* runs from the Lock call "+
			"to its return; *hand-off* from one holder's Unlock call to the next holder's Lock return. Requests are the "+
			"commands all clients sent (go-redis hooks, a rueidis wrapper, and the server's count of (un)subscribe "+
			"commands) per acquisition; Redis CPU is INFO cpu (user+sys) per acquisition. Peers that wait by polling "+
			"(redsync, bsm/redislock, raw) retry every %v, tuned to the hold (their defaults — redsync 50–250 ms, "+
			"bsm no retry — would do far worse). Fair mode has no counterpart among the peers. *Overlaps* counts "+
			"grants that came before the previous holder's Unlock call (must be 0).",
			s.contProcs, s.contG, s.contDur, s.hold, s.pollRetry),
		Metrics: []Metric{
			{"acqs", "acq/s", "%.0f"},
			{"util", "held", "%.3f"},
			{"p50", "wait p50 ms", "%.2f"},
			{"p99", "wait p99 ms", "%.1f"},
			{"h50", "hand-off p50 µs", "%.0f"},
			{"h99", "hand-off p99 µs", "%.0f"},
			{"reqs", "requests/acq", "%.2f"},
			{"cpu", "Redis CPU/acq µs", "%.0f"},
			{"overlap", "overlaps", "%.0f"},
		}}
	e.res.Tables = append(e.res.Tables, t)
	names := append([]string{systems.Locks, systems.LocksFair}, lockPeers...)
	return e.series(ctx, t, names, func(ctx context.Context, r *Row, _ int) error {
		key := e.key("contended")
		jobs := make([]Job, s.contProcs)
		for i := range jobs {
			jobs[i] = Job{Kind: "contended", System: r.System, Addrs: []string{e.addr}, Goroutines: s.contG,
				Duration: s.contDur, Hold: s.hold, Retry: s.pollRetry, Key: key}
		}
		reps, cpu, subs, err := e.measured(ctx, jobs)
		if err != nil {
			return err
		}
		var acqs []Acq
		var reqs int64
		for _, rep := range reps {
			acqs = append(acqs, rep.Acqs...)
			reqs += rep.Requests
		}
		if len(acqs) == 0 {
			return fmt.Errorf("no acquisitions: %v", firstErr(reps))
		}
		slices.SortFunc(acqs, func(a, b Acq) int { return cmp.Compare(a.Grant, b.Grant) })
		var held, overlaps int64
		waits := make([]time.Duration, len(acqs))
		var hand []time.Duration
		end := acqs[0].Release
		for i, a := range acqs {
			held += a.Release - a.Grant
			waits[i] = time.Duration(a.Wait)
			end = max(end, a.Release)
			if i > 0 {
				gap := a.Grant - acqs[i-1].Release
				if gap < 0 {
					overlaps++
				} else {
					hand = append(hand, time.Duration(gap))
				}
			}
		}
		window := float64(end - acqs[0].Grant)
		na := float64(len(acqs))
		wd, hd := stats.Durations(waits), stats.Durations(hand)
		r.add("acqs", na/(window/1e9))
		r.add("util", float64(held)/window)
		r.add("p50", stats.Ms(wd.P50))
		r.add("p99", stats.Ms(wd.P99))
		r.add("h50", float64(hd.P50)/1e3)
		r.add("h99", float64(hd.P99)/1e3)
		r.add("reqs", float64(reqs+subs)/na)
		r.add("cpu", float64(cpu)/1e3/na)
		r.add("overlap", float64(overlaps))
		for _, w := range waits {
			e.res.ContendedWait[r.System] = append(e.res.ContendedWait[r.System], stats.Ms(w))
		}
		return firstErr(reps)
	})
}
