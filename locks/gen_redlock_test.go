package locks

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"pgregory.net/rapid"

	"github.com/cacheguard/cacheguard/internal/redistest"
	"github.com/cacheguard/cacheguard/internal/testing/gen"
)

// TestGenRedlock is TestGenLocks for Redlock: Redlocks (processes, each with
// its own node clients) on three independent servers take a few names, with
// faults at reply granularity on one node of one process (the genFault hook:
// a request held, a reply delayed, dropped or its command sent twice), a
// node stalled by SIGSTOP, a key lost on a node, a process closed. The
// oracle is Redis's own state and expiry on every node, read by independent
// clients:
//
//   - at no instant does an acquisition (its Unlock not begun) report a
//     positive TTL (its validity) while fewer than a quorum of nodes keep its
//     hold — the owner and its acquisition id — with the unreadable (stalled)
//     nodes counted as keeping it; so no two owners ever both believe they
//     hold a name;
//   - every acquisition ends in exactly one EventReleased or EventLost;
//   - every call returns within its context (plus a slack for a loaded
//     host).
func TestGenRedlock(t *testing.T) {
	servers := redistest.StartN(t, 3)
	st := &genStats{}
	gen.Check(t, 20, func(rt *rapid.T) {
		st.add(&st.deployments, "redlock")
		genRedlockRun(rt, servers, st)
	})
	t.Logf("gen: %s", st)
}

// rlProc is one process of TestGenRedlock.
type rlProc struct {
	r       *Redlock
	clients []*redis.Client
	faults  []*genFault // one per node client
	ev      *endEvents
	owner   string
}

// rlGenHold is an acquisition the run holds.
type rlGenHold struct {
	lk        *Lock
	name      string
	proc      int
	unlocking atomic.Bool // its Unlock began
	lost      atomic.Bool // a key of its name was deleted on a node: not checked
}

type rlWorld struct {
	rt      *rapid.T
	servers []*redistest.Server
	mon     []*redis.Client // one per node
	st      *genStats
	names   []string
	procs   []*rlProc
	old     []*rlProc
	calls   sync.WaitGroup
	start   time.Time

	mu         sync.Mutex // guards the fields below
	log        []string
	holds      []*rlGenHold
	violations []string
	deletedAt  map[string]time.Time
	stalled    bool
}

func (w *rlWorld) note(format string, args ...any) {
	line := fmt.Sprintf("%7.1fms ", float64(time.Since(w.start).Microseconds())/1000) + fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.log = append(w.log, line)
	w.mu.Unlock()
}

func (w *rlWorld) violate(format string, args ...any) {
	w.note("VIOLATION: "+format, args...)
	w.mu.Lock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

func (w *rlWorld) check(rt *rapid.T) {
	w.mu.Lock()
	v, log := w.violations, strings.Join(w.log, "\n")
	w.violations = nil
	w.mu.Unlock()
	if len(v) > 0 {
		rt.Fatalf("%d violations, first: %s\nlog:\n%s", len(v), strings.Join(v[:min(len(v), 5)], "; "), log)
	}
}

// late records a call that returned over past its context.
func (w *rlWorld) late(what string, over time.Duration) {
	w.st.mu.Lock()
	if over > w.st.worst {
		w.st.worst, w.st.worstOf = over, what
	}
	w.st.mu.Unlock()
	if over > genSlack {
		w.violate("%s returned %v past its context", what, over)
	}
}

func (w *rlWorld) newProc() *rlProc {
	pn := len(w.procs) + len(w.old)
	p := &rlProc{ev: &endEvents{}, owner: NewOwnerID()}
	var clients []redis.UniversalClient
	for _, s := range w.servers {
		c := redis.NewClient(&redis.Options{Addr: s.Addr(), ContextTimeoutEnabled: true})
		f := &genFault{}
		c.AddHook(f)
		p.clients = append(p.clients, c)
		p.faults = append(p.faults, f)
		clients = append(clients, c)
	}
	p.r = NewRedlock(clients, CommandTimeout(genCommandTimeout), NodeTimeout(100*time.Millisecond),
		Observer(func(ctx context.Context, e Event) {
			p.ev.observe(ctx, e)
			w.note("p%d event %v %s err=%v", pn, e.Kind, e.Name, e.Err)
		}))
	return p
}

// closeProc closes p's Redlock, then its node clients.
func closeProc(p *rlProc, shutdown func(*Redlock)) {
	shutdown(p.r)
	for i, c := range p.clients {
		p.faults[i].clear()
		_ = c.Close()
		p.faults[i].wg.Wait()
	}
}

func genRedlockRun(rt *rapid.T, servers []*redistest.Server, st *genStats) {
	st.mu.Lock()
	st.checks++
	st.mu.Unlock()
	run := genRunID.Add(1)
	w := &rlWorld{rt: rt, servers: servers, st: st, start: time.Now(), deletedAt: map[string]time.Time{}}
	for _, s := range servers {
		w.mon = append(w.mon, s.Client())
	}
	for i := range 2 {
		w.names = append(w.names, fmt.Sprintf("rlgen%d-%d", run, i))
	}
	for range 3 {
		w.procs = append(w.procs, w.newProc())
	}
	stop, monDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(monDone)
		w.monitor(stop)
	}()
	wound := false
	defer func() {
		if !wound { // rapid ended the run early (see genLocksRun)
			for _, p := range append(w.procs, w.old...) {
				for _, f := range p.faults {
					f.clear()
				}
			}
			w.calls.Wait()
			for _, p := range append(w.procs, w.old...) {
				closeProc(p, func(r *Redlock) { _ = r.Close() })
			}
		}
		close(stop)
		<-monDone
	}()
	scripts := map[*script]string{&redlockAcquireS: "acquire", &redlockReleaseS: "release", &redlockExtendS: "extend"}

	actions := map[string]func(*rapid.T){
		"a-lock": func(rt *rapid.T) {
			w.st.add(&w.st.actions, "lock")
			p := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			name := rapid.SampledFrom(w.names).Draw(rt, "name")
			try := rapid.Bool().Draw(rt, "try")
			owned := rapid.Bool().Draw(rt, "owned")
			lease := rapid.SampledFrom([]time.Duration{300 * time.Millisecond, 800 * time.Millisecond, 2 * time.Second}).Draw(rt, "lease")
			opts := []CallOption{Lease(lease), WaitBudget(rapid.SampledFrom([]time.Duration{300 * time.Millisecond, time.Second}).Draw(rt, "budget"))}
			if rapid.IntRange(0, 5).Draw(rt, "fixed") == 0 {
				opts = append(opts, NoRenewal())
			}
			timeout := rapid.SampledFrom([]time.Duration{50 * time.Millisecond, 400 * time.Millisecond, 1500 * time.Millisecond}).Draw(rt, "ctx")
			w.lock(p, name, try, owned, timeout, opts)
		},
		"b-unlock": func(rt *rapid.T) {
			h := w.pick(rt)
			if h == nil {
				rt.Skip("nothing held")
			}
			w.st.add(&w.st.actions, "unlock")
			timeout := rapid.SampledFrom([]time.Duration{100 * time.Millisecond, time.Second}).Draw(rt, "ctx")
			h.unlocking.Store(true)
			w.note("p%d Unlock(%s) %s begins", h.proc, h.name, h.lk.h.keys[1])
			w.calls.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				start := time.Now()
				err := h.lk.Unlock(ctx)
				w.late("Unlock", time.Since(start)-timeout)
				w.note("p%d Unlock(%s) %s: %v", h.proc, h.name, h.lk.h.keys[1], err)
				w.drop(h)
			})
		},
		"c-extend": func(rt *rapid.T) {
			h := w.pick(rt)
			if h == nil {
				rt.Skip("nothing held")
			}
			w.st.add(&w.st.actions, "extend")
			d := rapid.SampledFrom([]time.Duration{200 * time.Millisecond, 900 * time.Millisecond, 3 * time.Second}).Draw(rt, "lease")
			timeout := rapid.SampledFrom([]time.Duration{100 * time.Millisecond, time.Second}).Draw(rt, "ctx")
			w.calls.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), timeout)
				defer cancel()
				start := time.Now()
				err := h.lk.Extend(ctx, d)
				w.late("Extend", time.Since(start)-timeout)
				w.note("p%d Extend(%s, %v) %s: %v, ttl %v", h.proc, h.name, d, h.lk.h.keys[1], err, h.lk.TTL())
			})
		},
		"e-fault": func(rt *rapid.T) {
			p := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			node := rapid.IntRange(0, len(w.servers)-1).Draw(rt, "node")
			sc := rapid.SampledFrom([]*script{&redlockAcquireS, &redlockReleaseS, &redlockExtendS}).Draw(rt, "script")
			mode := rapid.SampledFrom([]string{"late", "delay", "drop", "dup"}).Draw(rt, "mode")
			d := time.Duration(rapid.IntRange(20, 600).Draw(rt, "delay")) * time.Millisecond
			n := rapid.IntRange(1, 3).Draw(rt, "count")
			w.st.add(&w.st.actions, "fault")
			w.st.add(&w.st.faults, mode+":"+scripts[sc])
			w.note("p%d node %d fault %s %v x%d on %s", p, node, mode, d, n, scripts[sc])
			w.procs[p].faults[node].set(&genRule{script: sc, mode: mode, d: d, left: n})
		},
		"f-stall": func(rt *rapid.T) {
			if rapid.IntRange(0, 2).Draw(rt, "stall?") != 0 {
				w.wait(rt)
				return
			}
			w.mu.Lock()
			busy := w.stalled
			w.stalled = true
			w.mu.Unlock()
			if busy {
				rt.Skip("stalled already")
			}
			d := time.Duration(rapid.IntRange(50, 700).Draw(rt, "stall")) * time.Millisecond
			srv := rapid.IntRange(0, len(w.servers)-1).Draw(rt, "server")
			w.st.add(&w.st.actions, "stall")
			w.st.add(&w.st.faults, "redis-sigstop")
			w.note("node %d stalled for %v", srv, d)
			w.servers[srv].Pause()
			w.calls.Go(func() {
				time.Sleep(d) // the fault's length
				w.servers[srv].Resume()
				w.note("node %d resumed", srv)
				w.mu.Lock()
				w.stalled = false
				w.mu.Unlock()
			})
		},
		"h-del": func(rt *rapid.T) {
			if rapid.IntRange(0, 3).Draw(rt, "del?") != 0 {
				w.wait(rt)
				return
			}
			name := rapid.SampledFrom(w.names).Draw(rt, "name")
			node := rapid.IntRange(0, len(w.servers)-1).Draw(rt, "node")
			w.st.add(&w.st.actions, "del")
			w.st.add(&w.st.faults, "del-key")
			w.note("DEL %s on node %d", name, node)
			// As in TestGenLocks: the name's holds, and those begun before
			// the DEL returned, are exempt from the monitor.
			exempt := func(until time.Time) {
				w.mu.Lock()
				for _, h := range w.holds {
					if h.name == name {
						h.lost.Store(true)
					}
				}
				w.deletedAt[name] = until
				w.mu.Unlock()
			}
			exempt(time.Now().Add(time.Hour))
			dctx, cancel := context.WithTimeout(context.Background(), time.Second)
			w.mon[node].Del(dctx, "cg:rlock:{"+name+"}")
			cancel()
			exempt(time.Now())
		},
		"g-close": func(rt *rapid.T) {
			if rapid.IntRange(0, 2).Draw(rt, "close?") != 0 {
				w.wait(rt)
				return
			}
			p := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			graceful := rapid.Bool().Draw(rt, "shutdown")
			w.st.add(&w.st.actions, "close")
			old := w.procs[p]
			w.note("p%d closed (shutdown %v); a new process replaces it", p, graceful)
			w.old = append(w.old, old)
			w.procs[p] = w.newProc()
			w.calls.Go(func() {
				if !graceful {
					_ = old.r.Close()
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				start := time.Now()
				_ = old.r.Shutdown(ctx)
				w.late("Shutdown", time.Since(start)-300*time.Millisecond-2*genCommandTimeout)
			})
		},
		"d-wait": w.wait,
		"":       func(rt *rapid.T) { w.check(rt) },
	}
	rt.Repeat(actions)

	// Wind down: no more faults, every call returned, every process closed
	// (Close drops what is held), then the oracle's last word.
	for _, p := range append(w.procs, w.old...) {
		for _, f := range p.faults {
			f.clear()
		}
	}
	w.calls.Wait()
	for _, p := range append(w.procs, w.old...) {
		closeProc(p, func(r *Redlock) { _ = r.Close() })
	}
	wound = true
	w.check(rt)
	for i, p := range append(w.procs, w.old...) {
		if begun, ends := p.ev.counts(); begun != ends {
			rt.Fatalf("process %d: %d acquisitions, %d end events", i, begun, ends)
		}
	}
}

func (w *rlWorld) wait(rt *rapid.T) {
	w.st.add(&w.st.actions, "wait")
	time.Sleep(time.Duration(rapid.IntRange(5, 250).Draw(rt, "ms")) * time.Millisecond) // time passing is the subject
}

func (w *rlWorld) lock(p int, name string, try, owned bool, timeout time.Duration, opts []CallOption) {
	proc := w.procs[p]
	w.calls.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		if owned {
			ctx = WithOwner(ctx, proc.owner)
		}
		start := time.Now()
		var lk *Lock
		var err error
		if try {
			lk, err = proc.r.TryLock(ctx, name, opts...)
		} else {
			lk, err = proc.r.Lock(ctx, name, opts...)
		}
		w.late("Lock", time.Since(start)-timeout)
		what := map[bool]string{true: "TryLock", false: "Lock"}[try]
		if err != nil {
			w.note("p%d %s(%s) owned=%v ctx=%v: %v", p, what, name, owned, timeout, err)
			return
		}
		w.note("p%d %s(%s) owned=%v ctx=%v: %s ttl %v", p, what, name, owned, timeout, lk.h.keys[1], lk.TTL())
		w.mu.Lock()
		h := &rlGenHold{lk: lk, name: name, proc: p}
		if start.Before(w.deletedAt[name]) {
			h.lost.Store(true)
		}
		w.holds = append(w.holds, h)
		w.mu.Unlock()
	})
}

func (w *rlWorld) pick(rt *rapid.T) *rlGenHold {
	w.mu.Lock()
	var open []*rlGenHold
	for _, h := range w.holds {
		if !h.unlocking.Load() {
			open = append(open, h)
		}
	}
	w.mu.Unlock()
	if len(open) == 0 {
		return nil
	}
	return open[rapid.IntRange(0, len(open)-1).Draw(rt, "hold")]
}

func (w *rlWorld) drop(h *rlGenHold) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, x := range w.holds {
		if x == h {
			w.holds = append(w.holds[:i], w.holds[i+1:]...)
			return
		}
	}
}

// monitor samples, until stop, each held acquisition's belief (its TTL),
// then every node's state of its name, and records every instant at which
// an acquisition believed it held a name that fewer than a quorum of nodes
// (counting those that could not be read) kept for it.
func (w *rlWorld) monitor(stop <-chan struct{}) {
	quorum := len(w.servers)/2 + 1
	for {
		select {
		case <-stop:
			return
		default:
		}
		type belief struct {
			h     *rlGenHold
			until time.Time
		}
		w.mu.Lock()
		var bs []belief
		for _, h := range w.holds {
			if !h.unlocking.Load() && !h.lost.Load() {
				now := time.Now()
				if ttl := h.lk.TTL(); ttl > 0 {
					bs = append(bs, belief{h, now.Add(ttl)})
				}
			}
		}
		w.mu.Unlock()
		// state[node][name]: the hash, nil when the node could not be read
		state := make([]map[string]map[string]string, len(w.mon))
		var wg sync.WaitGroup
		for i, c := range w.mon {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				defer cancel()
				pipe := c.Pipeline()
				cmds := make([]*redis.MapStringStringCmd, len(w.names))
				for j, n := range w.names {
					cmds[j] = pipe.HGetAll(ctx, "cg:rlock:{"+n+"}")
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return
				}
				m := map[string]map[string]string{}
				for j, n := range w.names {
					m[n] = cmds[j].Val()
				}
				state[i] = m
			})
		}
		wg.Wait()
		read := time.Now()
		atomic.AddInt64(&w.st.samples, 1)
		for _, b := range bs {
			have := 0
			for _, m := range state {
				if m == nil {
					have++ // stalled: counted as keeping it
					continue
				}
				hash := m[b.h.name]
				if _, ok := hash[b.h.lk.h.keys[1]]; ok && hash["o"] == b.h.lk.h.owner {
					have++
				}
			}
			if have < quorum && b.until.After(read.Add(2*time.Millisecond)) && !b.h.unlocking.Load() && !b.h.lost.Load() {
				w.violate("%s: process %d's acquisition %s held %v more while %d of %d nodes kept it",
					b.h.name, b.h.proc, b.h.lk.h.keys[1], b.until.Sub(read).Round(time.Millisecond), have, len(w.mon))
			}
		}
		time.Sleep(2 * time.Millisecond) // the sampling period
	}
}
