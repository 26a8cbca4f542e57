package bench

import (
	"cmp"
	"context"
	"fmt"
	"math"
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
	{"csw", "context switches/cycle", "%.2f"},
	{"vcsw", "voluntary/cycle", "%.2f"},
	{"sys", "read+write syscalls/cycle", "%.2f"},
	{"wake", "goroutine wake-ups/cycle", "%.2f"},
	{"hand", "hand-offs/cycle", "%.3f"},
	{"cpu", "client CPU µs/cycle", "%.1f"},
	{"rcpu", "Redis CPU µs/cycle", "%.1f"},
	{"rcmds", "Redis commands/cycle (scripts' own included)", "%.1f"},
}

// cycles is what one uncontended run measured.
type cycles struct {
	ops, p50, p99, allocs, reqs float64 // cycles/s, µs, µs, per cycle, per cycle
	csw, vcsw, sys              float64 // per cycle (see osCounts); sys NaN when not counted
	wake, hand                  float64 // per cycle, from a traced run (see wakes); NaN when not traced
	cpu, rcpu, rcmds            float64 // the process's and Redis's CPU µs, Redis's commands, per cycle; rcpu, rcmds NaN on other servers than e.addr
}

// cycleMeasure runs one uncontended run of system (lock then unlock, every
// goroutine on its own name, or over names names in all, each goroutine
// cycling over its share).
func (e *env) cycleMeasure(ctx context.Context, system string, addrs []string, g, names int, d time.Duration, request bool) (cycles, error) {
	// Who wakes a call's goroutine is counted where context switches
	// are judged: scenario 1 and table 1c (not 1d, 1b or Redlock's).
	job := Job{Kind: "cycle", System: system, Addrs: addrs, Goroutines: g, Keys: names, Duration: d, Key: e.key("cycle"), Request: request}
	reps, rcpu, _, err := e.measured(ctx, []Job{job})
	if err != nil {
		return cycles{}, err
	}
	rep := reps[0]
	if rep.Dist == nil {
		return cycles{}, fmt.Errorf("no latencies reported")
	}
	dist := *rep.Dist
	ops := float64(rep.Ops)
	sys := math.NaN()
	if rep.Syscalls >= 0 {
		sys = float64(rep.Syscalls) / max(ops, 1)
	}
	rc, rcmds := math.NaN(), math.NaN()
	if len(addrs) == 1 && addrs[0] == e.addr { // the server measured counts
		rc = float64(rcpu.Microseconds()) / max(ops, 1)
		rcmds = float64(e.serverCmds) / max(ops, 1)
	}
	wake, hand := math.NaN(), math.NaN()
	if err := firstErr(reps); err == nil && !request && names == g && len(addrs) == 1 {
		if wake, hand, err = e.wakes(ctx, job); err != nil {
			return cycles{}, err
		}
	}
	return cycles{ops: ops / time.Duration(rep.Elapsed).Seconds(), p50: float64(dist.P50) / 1e3, p99: float64(dist.P99) / 1e3,
		allocs: float64(rep.Mallocs) / max(ops, 1), reqs: float64(rep.Requests) / max(ops, 1),
		csw: float64(rep.CSw) / max(ops, 1), vcsw: float64(rep.VCSw) / max(ops, 1), sys: sys, wake: wake, hand: hand,
		cpu: float64(rep.CPU) / 1e3 / max(ops, 1), rcpu: rc, rcmds: rcmds}, firstErr(reps)
}

// cycleRun records one uncontended run (lock then unlock, every goroutine on
// its own name) of one system; with request, each cycle under a cancellable
// context of its own (see Job.Request).
func (e *env) cycleRun(ctx context.Context, r *Row, addrs []string, g int, d time.Duration, request bool) (cycles, error) {
	c, err := e.cycleMeasure(ctx, r.System, addrs, g, g, d, request)
	if c.ops > 0 {
		r.add("ops", c.ops)
		r.add("p50", c.p50)
		r.add("p99", c.p99)
		r.add("allocs", c.allocs)
		r.add("reqs", c.reqs)
		r.add("csw", c.csw)
		r.add("vcsw", c.vcsw)
		if !math.IsNaN(c.sys) {
			r.add("sys", c.sys)
		}
		if !math.IsNaN(c.wake) {
			r.add("wake", c.wake)
			r.add("hand", c.hand)
		}
		r.add("cpu", c.cpu)
		if !math.IsNaN(c.rcpu) {
			r.add("rcpu", c.rcpu)
			r.add("rcmds", c.rcmds)
		}
	}
	return c, err
}

func (e *env) manyNames(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "names", Title: "1b. Uncontended lock cycles over many hot names",
		Intro: fmt.Sprintf("Scenario 1 (one process, %d goroutines, %v per run), each goroutine cycling over its "+
			"share of %d names instead of one name of its own; every name was locked once before the run. "+
			"Each repetition measures both, in alternating order; *ratio* is the many-name run's cycles/s over "+
			"the %d-name run's of the same repetition. CPU is per cycle, the worker process's (getrusage) and "+
			"Redis's (INFO cpu): where a many-name cycle's extra time goes. The raw SET NX PX loop is the "+
			"reference: one key per name, deleted by its release, where a lock keeps its fence counter.", s.cycleG, s.cycleDur, s.manyNames, s.cycleG),
		Metrics: []Metric{
			{"few", fmt.Sprintf("cycles/s, %d names", s.cycleG), "%.0f"},
			{"many", fmt.Sprintf("cycles/s, %d names", s.manyNames), "%.0f"},
			{"ratio", "ratio", "%.3f"},
			{"afew", fmt.Sprintf("allocs/cycle, %d names", s.cycleG), "%.1f"},
			{"amany", fmt.Sprintf("allocs/cycle, %d names", s.manyNames), "%.1f"},
			{"cfew", fmt.Sprintf("client CPU µs/cycle, %d names", s.cycleG), "%.1f"},
			{"cmany", fmt.Sprintf("client CPU µs/cycle, %d names", s.manyNames), "%.1f"},
			{"rfew", fmt.Sprintf("Redis CPU µs/cycle, %d names", s.cycleG), "%.1f"},
			{"rmany", fmt.Sprintf("Redis CPU µs/cycle, %d names", s.manyNames), "%.1f"},
		}}
	e.res.Tables = append(e.res.Tables, t)
	return e.seriesN(ctx, e.capped(s.newReps), t, []string{systems.Locks, systems.RawSetNX}, func(ctx context.Context, r *Row, rep int) error {
		sizes := []int{s.cycleG, s.manyNames}
		if rep%2 == 1 {
			sizes[0], sizes[1] = sizes[1], sizes[0]
		}
		got := map[int]cycles{}
		for _, n := range sizes {
			c, err := e.cycleMeasure(ctx, r.System, []string{e.addr}, s.cycleG, n, s.cycleDur, false)
			if err != nil {
				return err
			}
			got[n] = c
		}
		few, many := got[s.cycleG], got[s.manyNames]
		r.add("few", few.ops)
		r.add("many", many.ops)
		r.add("ratio", many.ops/few.ops)
		r.add("afew", few.allocs)
		r.add("amany", many.allocs)
		r.add("cfew", few.cpu)
		r.add("cmany", many.cpu)
		if !math.IsNaN(few.rcpu) && !math.IsNaN(many.rcpu) {
			r.add("rfew", few.rcpu)
			r.add("rmany", many.rcpu)
		}
		return nil
	})
}

// contention is what one contended run measured: acquisitions per second,
// the share of time held, waits and hand-offs (from one holder's Unlock call
// to the next holder's grant), grants before the previous Unlock call.
type contention struct {
	acqs, util  float64
	hold        float64 // mean µs from Lock's return to the Unlock call: the holder's 1 ms sleep, as late as the host made it
	waits, hand stats.Dist
	overlaps    int64
	waitMs      []float64
}

// contend analyses the acquisitions of a contended run that were granted
// before until (unix ns; 0: all).
func contend(acqs []Acq, until int64) (contention, error) {
	if until > 0 {
		acqs = slices.DeleteFunc(slices.Clone(acqs), func(a Acq) bool { return a.Grant > until })
	}
	if len(acqs) == 0 {
		return contention{}, fmt.Errorf("no acquisitions")
	}
	slices.SortFunc(acqs, func(a, b Acq) int { return cmp.Compare(a.Grant, b.Grant) })
	var c contention
	var held int64
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
				c.overlaps++
			} else {
				hand = append(hand, time.Duration(gap))
			}
		}
	}
	window := float64(end - acqs[0].Grant)
	c.acqs = float64(len(acqs)) / (window / 1e9)
	c.util = float64(held) / window
	c.hold = float64(held) / float64(len(acqs)) / 1e3
	c.waits, c.hand = stats.Durations(waits), stats.Durations(hand)
	for _, w := range waits {
		c.waitMs = append(c.waitMs, stats.Ms(w))
	}
	return c, nil
}

func (e *env) handoff(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "handoff", Title: "2b. Hand-off with many local waiters on one name",
		Intro: fmt.Sprintf("One process: 1 + N goroutines take one lock name in a loop for %v per run and hold it %v, "+
			"so that N callers wait while one holds it; *hand-off* runs from one holder's Unlock call to the next "+
			"holder's Lock return (scenario 2), over the grants made before the run's end (after it, the waiters "+
			"run out). Each repetition runs every N, in rotating order.", s.contDur, s.hold),
	}
	for _, key := range []string{"h50", "h99", "acqs"} {
		for _, n := range s.handWaiters {
			head := map[string]string{"h50": "hand-off p50 µs", "h99": "hand-off p99 µs", "acqs": "acq/s"}[key]
			t.Metrics = append(t.Metrics, Metric{fmt.Sprintf("%s-%d", key, n), fmt.Sprintf("%s, N=%d", head, n), "%.0f"})
		}
	}
	// The targets read the ratio of the largest N to the smallest within
	// each repetition (their runs are seconds apart), not the ratio of two
	// medians taken over repetitions minutes apart on a shared host.
	lo, hi := s.handWaiters[0], s.handWaiters[len(s.handWaiters)-1]
	for _, q := range []string{"50", "99"} {
		t.Metrics = append(t.Metrics, Metric{"r" + q, fmt.Sprintf("p%s, N=%d ÷ N=%d (same repetition)", q, hi, lo), "%.2f"})
	}
	e.res.Tables = append(e.res.Tables, t)
	return e.seriesN(ctx, e.capped(s.newReps), t, []string{systems.Locks, systems.LocksFair}, func(ctx context.Context, r *Row, rep int) error {
		ns := slices.Clone(s.handWaiters)
		k := rep % len(ns)
		ns = slices.Concat(ns[k:], ns[:k])
		hand := map[int]stats.Dist{}
		for _, n := range ns {
			reps, _, _, err := e.measured(ctx, []Job{{Kind: "contended", System: r.System, Addrs: []string{e.addr},
				Goroutines: n + 1, Duration: s.contDur, Hold: s.hold, Retry: s.pollRetry, Key: e.key("handoff"), Cutoff: true}})
			if err != nil {
				return err
			}
			c, err := contend(reps[0].Acqs, reps[0].Start+int64(s.contDur))
			if err != nil {
				return fmt.Errorf("N=%d: %w (%v)", n, err, firstErr(reps))
			}
			if c.overlaps > 0 {
				return fmt.Errorf("N=%d: %d overlapping grants", n, c.overlaps)
			}
			hand[n] = c.hand
			r.add(fmt.Sprintf("h50-%d", n), float64(c.hand.P50)/1e3)
			r.add(fmt.Sprintf("h99-%d", n), float64(c.hand.P99)/1e3)
			r.add(fmt.Sprintf("acqs-%d", n), c.acqs)
			if err := firstErr(reps); err != nil {
				return fmt.Errorf("N=%d: %w", n, err)
			}
		}
		if a, b := hand[hi], hand[lo]; b.P50 > 0 && b.P99 > 0 {
			r.add("r50", float64(a.P50)/float64(b.P50))
			r.add("r99", float64(a.P99)/float64(b.P99))
		}
		return nil
	})
}

var lockPeers = []string{systems.Redsync, systems.BSM, systems.Rueidislock, systems.RawSetNX}

func (e *env) uncontended(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "uncontended", Title: "1. Uncontended lock cycle",
		Intro: fmt.Sprintf("One process, %d goroutines, each locking and unlocking its own name for %v per run "+
			"(Lock + Unlock, the blocking API of each library). Allocations are the process's heap allocations "+
			"per cycle (runtime.MemStats), background work included; requests are the commands the process sent. "+
			"*Own scripts, sent raw* is a control: the two command lines of cacheguard's Lock and Unlock, each sent on "+
			"its caller's goroutine, without the lock's batching or any of its machinery."+wakesIntro+
			" A call that finds a send on the wire queues, and is handed its reply by the caller that sends the next batch: one hand-off per queued call, by design.",
			s.cycleG, s.cycleDur),
		Metrics: cycleMetrics}
	lone := &Table{ID: "lone-cycle", Title: "1c. Uncontended lock cycle, one goroutine: what a call asks of the kernel",
		Intro: fmt.Sprintf("Scenario 1 with one goroutine, for %v per run: nothing to share a round trip with. "+
			"Context switches (getrusage) and read/write system calls (/proc/self/io syscr+syscw) are the worker "+
			"process's own per cycle: they count what a call asks of the kernel — a command handed to another "+
			"goroutine costs a thread's sleep and wake-up where no thread is awake to take it — whatever the host "+
			"charges for each; the involuntary switches also count preemption by other work on the host, and every switch "+
			"count includes the runtime's monitor thread (sysmon), which wakes every 20 µs to 10 ms while the process "+
			"runs, so a longer cycle costs more of them."+wakesIntro, s.loneDur),
		Metrics: cycleMetrics}
	req := &Table{ID: "lone-cycle-request", Title: "1d. Uncontended lock cycle, one goroutine, under a request's context",
		Intro: "Table 1c with each Lock and Unlock called under a context of its own that can be cancelled " +
			"(context.WithCancel, as a server's request has; cancelled after the Unlock), instead of context.Background. " +
			"Each repetition of table 1c runs this one too, for the same system, in alternating order; *vs Background* " +
			"is this run's cycles/s over table 1c's of the same repetition.",
		Metrics: append(slices.Clone(cycleMetrics), Metric{"ratio", "vs Background", "%.3f"})}
	e.res.Tables = append(e.res.Tables, t, lone, req)
	err := e.series(ctx, t, append([]string{systems.Locks, systems.LocksScripts}, lockPeers...), func(ctx context.Context, r *Row, _ int) error {
		_, err := e.cycleRun(ctx, r, []string{e.addr}, s.cycleG, s.cycleDur, false)
		return err
	})
	if err != nil {
		return err
	}
	return e.series(ctx, lone, []string{systems.Locks, systems.LocksScripts, systems.BSM, systems.RawSetNX}, func(ctx context.Context, r *Row, rep int) error {
		rq := req.Row(r.System)
		var bg, in cycles
		for i := range 2 {
			var err error
			if (i+rep)%2 == 0 {
				bg, err = e.cycleRun(ctx, r, []string{e.addr}, 1, s.loneDur, false)
			} else {
				in, err = e.cycleRun(ctx, rq, []string{e.addr}, 1, s.loneDur, true)
			}
			if err != nil {
				return err
			}
		}
		if bg.ops > 0 && in.ops > 0 {
			rq.add("ratio", in.ops/bg.ops)
		}
		return nil
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
		_, err := e.cycleRun(ctx, r, addrs, s.cycleG, s.cycleDur, false)
		return err
	})
}

func (e *env) contended(ctx context.Context) error {
	s := e.s
	t := &Table{ID: "contended", Title: "2. Contended lock",
		Intro: fmt.Sprintf("%d OS processes × %d goroutines take one lock name in a loop for %v per run and hold it "+
			"%v. *Held* is the share of the run during which some caller held the lock (from Lock's return to the Unlock "+
			"call), *hold mean* the mean of one such holding: the %v sleep, made longer by the host's timer latency, "+
			"which the other work in the holder's process (pollers) lengthens; *wait* runs from the Lock call "+
			"to its return; *hand-off* from one holder's Unlock call to the next holder's Lock return. Requests are the "+
			"commands all clients sent (go-redis hooks, a rueidis wrapper, and the server's count of (un)subscribe "+
			"commands) per acquisition; Redis CPU is INFO cpu (user+sys) per acquisition. Peers that wait by polling "+
			"(redsync, bsm/redislock, raw) retry every %v, tuned to the hold (their defaults — redsync 50–250 ms, "+
			"bsm no retry — would do far worse). Fair mode has no counterpart among the peers. *Overlaps* counts "+
			"grants that came before the previous holder's Unlock call (must be 0).",
			s.contProcs, s.contG, s.contDur, s.hold, s.hold, s.pollRetry),
		Metrics: []Metric{
			{"acqs", "acq/s", "%.0f"},
			{"util", "held", "%.3f"},
			{"hold", "hold mean µs", "%.0f"},
			{"p50", "wait p50 ms", "%.2f"},
			{"p99", "wait p99 ms", "%.1f"},
			{"h50", "hand-off p50 µs", "%.0f"},
			{"h99", "hand-off p99 µs", "%.0f"},
			{"reqs", "requests/acq", "%.2f"},
			{"cpu", "Redis CPU/acq µs", "%.0f"},
			{"rcmds", "Redis commands/acq (scripts' own included)", "%.1f"},
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
		c, err := contend(acqs, 0)
		if err != nil {
			return fmt.Errorf("%w: %v", err, firstErr(reps))
		}
		na := float64(len(acqs))
		r.add("acqs", c.acqs)
		r.add("util", c.util)
		r.add("hold", c.hold)
		r.add("p50", stats.Ms(c.waits.P50))
		r.add("p99", stats.Ms(c.waits.P99))
		r.add("h50", float64(c.hand.P50)/1e3)
		r.add("h99", float64(c.hand.P99)/1e3)
		r.add("reqs", float64(reqs+subs)/na)
		r.add("cpu", float64(cpu)/1e3/na)
		r.add("rcmds", float64(e.serverCmds)/na)
		r.add("overlap", float64(c.overlaps))
		e.res.ContendedWait[r.System] = append(e.res.ContendedWait[r.System], c.waitMs...)
		return firstErr(reps)
	})
}
