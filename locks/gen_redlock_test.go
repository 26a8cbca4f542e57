package locks

import (
	"context"
	"fmt"
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
//   - a name is granted to no other owner before the lease of its last
//     acquisition, counted from that call, has run out on Redis's clock,
//     unless it was given back by Unlock, its key deleted or its lease set
//     by Extend (see leaseBound) — a hold lost at its local deadline is given
//     back no sooner;
//   - a Lock or TryLock fails with ErrNoValidity only when a fault struck
//     its process, or a server paused, or the call took as long as the
//     validity its lease gives; and it fails at all only when something
//     explains it (see genBase.obtained);
//   - every acquisition ends in exactly one EventReleased or EventLost;
//   - every call returns within its context (plus a slack for a loaded
//     host);
//   - once every call has returned, no node keeps a hold that no Lock is
//     held for (liveness: see genBase.orphans).
func TestGenRedlock(t *testing.T) {
	servers := redistest.StartN(t, 3)
	st := &genStats{stalls: gen.WatchStalls(t)}
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

type rlWorld struct {
	genBase
	servers []*redistest.Server
	mon     []*redis.Client // one per node
	names   []string
	procs   []*rlProc
	old     []*rlProc
	drift   time.Duration // the Redlocks' Drift: the span between a hold's local deadline and its keys' expiry
}

// rlAcq names a Redlock's Lock in a run's log: its acquisition id.
func rlAcq(lk *Lock) string { return lk.h.keys[1] }

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
	p.r = NewRedlock(clients, CommandTimeout(genCommandTimeout), NodeTimeout(100*time.Millisecond), Drift(w.drift),
		Observer(func(ctx context.Context, e Event) {
			p.ev.observe(ctx, e)
			w.note("p%d event %v %s err=%v", pn, e.Kind, e.Name, e.Err)
			w.observed(e)
		}))
	return p
}

// closeProc closes p's Redlock, then its node clients.
func closeProc(p *rlProc) {
	_ = p.r.Close()
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
	w := &rlWorld{genBase: genBase{st: st, start: time.Now(), deletedAt: map[string]time.Time{}}, servers: servers}
	for _, s := range servers {
		w.mon = append(w.mon, s.Client())
	}
	for i := range 2 {
		w.names = append(w.names, fmt.Sprintf("rlgen%d-%d", run, i))
	}
	w.drift = rapid.SampledFrom([]time.Duration{defaultDrift, 40 * time.Millisecond}).Draw(rt, "drift")
	w.panicky = rapid.IntRange(0, 3).Draw(rt, "panicky observers") == 0
	for range 3 {
		w.procs = append(w.procs, w.newProc())
	}
	stop, monDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(monDone)
		w.monitor(stop)
	}()
	// windDown: no more faults, every call returned, every process closed
	// (Close drops what is held). A run rapid ends early (see genLocksRun)
	// winds down in the deferred call.
	wound := false
	windDown := func() {
		for _, p := range append(w.procs, w.old...) {
			for _, f := range p.faults {
				f.clear()
			}
		}
		w.calls.Wait()
		for _, p := range append(w.procs, w.old...) {
			for _, f := range p.faults {
				f.wg.Wait()
			}
		}
		w.obtained()
		w.orphans()
		for _, p := range append(w.procs, w.old...) {
			closeProc(p)
		}
		wound = true
	}
	defer func() {
		if !wound {
			windDown()
		}
		close(stop)
		<-monDone
	}()
	scripts := map[*script]string{&redlockAcquireS: "acquire", &redlockReleaseS: "release", &redlockExtendS: "extend"}

	actions := map[string]func(*rapid.T){
		"a-lock": func(rt *rapid.T) {
			w.step("lock")
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
			proc := w.procs[p]
			// A Redlock asks again within its budget; its validity is its
			// lease less its round and the drift.
			w.lock(p, proc.r, proc.owner, name, try, owned, timeout, -1, opts, lease, rlAcq, proc.faults, rlSpan(&config{drift: w.drift}, lease))
		},
		"b-unlock": w.unlockAction(rlAcq),
		"c-extend": w.extendAction([]time.Duration{200 * time.Millisecond, 900 * time.Millisecond, 3 * time.Second}, rlAcq),
		"e-fault": func(rt *rapid.T) {
			p := rapid.IntRange(0, len(w.procs)-1).Draw(rt, "proc")
			node := rapid.IntRange(0, len(w.servers)-1).Draw(rt, "node")
			sc := rapid.SampledFrom([]*script{&redlockAcquireS, &redlockReleaseS, &redlockExtendS}).Draw(rt, "script")
			mode := rapid.SampledFrom([]string{"late", "delay", "drop", "dup", "stuck"}).Draw(rt, "mode")
			d := time.Duration(rapid.IntRange(20, 600).Draw(rt, "delay")) * time.Millisecond
			n := rapid.IntRange(1, 3).Draw(rt, "count")
			w.step("fault")
			w.st.add(&w.st.faults, mode+":"+scripts[sc])
			w.note("p%d node %d fault %s %v x%d on %s", p, node, mode, d, n, scripts[sc])
			w.procs[p].faults[node].set(&genRule{script: sc, mode: mode, d: d, left: n})
		},
		"f-stall": func(rt *rapid.T) {
			if rapid.IntRange(0, 2).Draw(rt, "stall?") != 0 {
				w.wait(rt)
				return
			}
			w.stall(rt, w.servers, 700*time.Millisecond)
		},
		"h-del": func(rt *rapid.T) {
			if rapid.IntRange(0, 3).Draw(rt, "del?") != 0 {
				w.wait(rt)
				return
			}
			name := rapid.SampledFrom(w.names).Draw(rt, "name")
			node := rapid.IntRange(0, len(w.servers)-1).Draw(rt, "node")
			w.note("DEL %s on node %d", name, node)
			w.lose(name, func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				w.mon[node].Del(ctx, "cg:rlock:{"+name+"}")
			})
		},
		"g-close": w.closeAction(len(w.procs), func(p int) (func(context.Context) error, func() error) {
			old := w.procs[p]
			w.old = append(w.old, old)
			w.procs[p] = w.newProc()
			return old.r.Shutdown, old.r.Close
		}, rlAcq),
		"d-wait": w.wait,
		"i-bad": func(rt *rapid.T) {
			ls := make([]Locker, len(w.procs))
			for i, p := range w.procs {
				ls[i] = p.r
			}
			w.badCall(rt, ls, func(name string) bool {
				for _, c := range w.mon {
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					n := c.Exists(ctx, "cg:rlock:{"+name+"}").Val() // a stalled node reads as none
					cancel()
					if n != 0 {
						return true
					}
				}
				return false
			})
		},
		"": func(rt *rapid.T) { w.check(rt) },
	}
	rt.Repeat(actions)

	windDown()
	w.check(rt) // the oracle's last word
	for i, p := range append(w.procs, w.old...) {
		if begun, ends := p.ev.counts(); begun != ends {
			rt.Fatalf("process %d: %d acquisitions, %d end events", i, begun, ends)
		}
	}
}

// orphans is the liveness oracle (see genBase.orphans) on every node.
func (w *rlWorld) orphans() {
	var faults []*genFault
	for _, p := range w.old {
		faults = append(faults, p.faults...)
	}
	w.genBase.orphans(func(ctx context.Context) (map[string]map[string]string, error) {
		in := map[string]map[string]string{}
		for i, c := range w.mon {
			for _, n := range w.names {
				key := "cg:rlock:{" + n + "}"
				fields, err := c.HGetAll(ctx, key).Result()
				if err != nil {
					return nil, err
				}
				for acq := range fields {
					if acq == "o" {
						continue
					}
					if in[n] == nil {
						in[n] = map[string]string{}
					}
					in[n][acq] = fmt.Sprintf("on node %d, %v of its lease left", i, c.PTTL(ctx, key).Val())
				}
			}
		}
		return in, nil
	}, rlAcq, closedAcqs(faults))
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
		bs := w.beliefs()
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
			if have < quorum && b.until.After(read.Add(2*time.Millisecond)) && !b.h.unlocking.Load() && !b.h.deleted.Load() {
				w.violate("%s: process %d's acquisition %s held %v more while %d of %d nodes kept it",
					b.h.name, b.h.proc, b.h.lk.h.keys[1], b.until.Sub(read).Round(time.Millisecond), have, len(w.mon))
			}
		}
		time.Sleep(2 * time.Millisecond) // the sampling period
	}
}
